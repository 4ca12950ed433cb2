"""The Responses API's conversation state: what ``store: true`` keeps and ``previous_response_id``
continues (:mod:`gateway.conversations.store`), the stored form (:mod:`.records`), and fitting a
conversation into a model's context (:mod:`.window`). The values live in a
:class:`gateway.store.TenantStore`, memory or Redis.
"""

from gateway.conversations.records import Record, Turn, input_items, new_id
from gateway.conversations.store import NAMESPACE, Conversation, ConversationStore

__all__ = ["NAMESPACE", "Conversation", "ConversationStore", "Record", "Turn", "input_items", "new_id"]

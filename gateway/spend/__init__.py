"""Spend in money: prices per route, the cost of each request, and budgets per key."""

"""The load generator: planned requests sent over streaming HTTP, one RequestRecord per request."""

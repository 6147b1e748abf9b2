"""The breaker function: pauses the writer's event source mapping while the database is down."""

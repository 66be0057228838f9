"""HTTP routers, one per resource. They validate and delegate to app.core.services."""

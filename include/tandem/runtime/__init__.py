"""What runs inside a Spark job: session, sources, publisher, listener, node main."""

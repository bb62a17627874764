"""What runs inside a Spark job: the plan API, source kinds, the foreachBatch publisher, the listener, the node main."""

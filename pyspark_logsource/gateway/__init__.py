"""The Kafka-protocol gateway (``plog serve``)."""

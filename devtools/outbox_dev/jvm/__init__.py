"""The JVM pieces the dev tools run, with the Java that outbox._core.java finds: jars from Maven.

- `kafka_tools.py` Kafka's own console consumer and kafka-transactions
- `maven.py`  resolve a pinned POM's jars once into a shared cache
- `log4j2.py` where a Java program we run writes its log
- `poms/`     the pinned jar sets: Kafka's broker, Spark's Kafka source, the JDBC driver, Debezium
"""

"""The JVM pieces the framework runs: a Java to run them, and jars from Maven.

- `java.py`   find Java 17+, or say how to install it
- `maven.py`  resolve a pinned POM's jars once into a shared cache
- `log4j2.py` where a Java program we run writes its log
- `poms/`     the pinned jar sets: Kafka's broker, Spark's Kafka source, the JDBC driver, Debezium
"""

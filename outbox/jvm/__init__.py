"""The JVM pieces the framework runs: a Java to run them, and jars from Maven.

- `java.py`   find Java 17+, or say how to install it
- `maven.py`  resolve a pinned POM's jars once into a shared cache
- `poms/`     the pinned jar sets: Kafka's broker, Spark's Kafka source, the JDBC driver
"""

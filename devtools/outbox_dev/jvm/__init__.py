"""The JVM pieces the dev tools run, with the Java that outbox.core.java finds: jars from Maven.

- `kafka_tools.py` Kafka's own console consumer and kafka-transactions
- `cds.py`    class-data archives: a JVM's classes mapped, not loaded, from its second start
- `maven.py`  resolve a pinned POM's jars once into a shared cache
- `log4j2.py` where a Java program we run writes its log
- `poms/`     the pinned jar sets: Kafka's broker, Spark's Kafka source, the JDBC driver, Debezium
"""

# For the JVMs the dev tools start (Kafka's broker and tools, Spark's standalone daemons, Apicurio),
# which live minutes at most and share two cores with what they serve: no /tmp/hsperfdata_<user>
# left behind, and C1 only. C2's compiler threads took a third of a core for a broker's first
# minutes, half its CPU under 20 transactions a second, 40% of a console consumer's, and
# Apicurio's start 5.8-7.4 CPU-seconds against 3.2-4.0 (measured, 2 cores): more than they gave
# back to programs this short-lived.
JVM_FLAGS = ("-XX:-UsePerfData", "-XX:TieredStopAtLevel=1")

"""`outbox status`: where every part of the loop stands, on one screen.

- `report.py`  what an operator is shown: plain values, the human lines and the JSON
- `gather.py`  reading them: the framework's tables in PostgreSQL, and the topics' ends in Kafka
"""

"""`outbox verify`: check a topic for duplicates, order violations, and what is missing or leaked.

- `findings.py`  the checks, plain functions over records already read
- `topic.py`     read a topic's committed records once, and pick out ids and sequences
"""

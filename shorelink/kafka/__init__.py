"""The kernel's Kafka wing: everything of the kernel that talks to a site's Kafka.

The ship-safe half of the kernel (``shorelink/*.py``) never imports this package, and
the edge agent never reaches it (tests/test_layout.py): a ship installs no Kafka client.
Every kernel module that imports ``confluent_kafka`` lives here.

- ``endpoint``: a site's Kafka as one value (bootstrap, credentials, timeout), the
  ``[kafka]`` table every config that reaches a Kafka embeds; every client is built
  from one;
- ``auth``: how a client proves who it is (SASL/SCRAM over TLS, or nothing);
- ``errors``: what can go wrong, one tree; the boundary that maps librdkafka's errors;
- ``admin``: the admin client whose calls and futures fail as that tree;
- ``transactions``: the transactional producer, where every transaction ends;
- ``topics``: creating topics on purpose, their durability and size limits;
- ``reading``: the one consumer (``PartitionReader``: ends as data, every jump a
  ``DataLoss``), reading topics to their end;
- ``sites``: each site's Kafka and streams from the sites file;
- ``audit``, ``consumer``, ``position``: the kernel's commands and a customer's reader.
"""

__all__ = [
    "admin",
    "audit",
    "auth",
    "consumer",
    "endpoint",
    "errors",
    "position",
    "reading",
    "sites",
    "topics",
    "transactions",
]

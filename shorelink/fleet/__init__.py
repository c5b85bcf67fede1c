"""The fleet registry (docs/fleet-registry.md): every ship's identity, token hashes,
signing keys with their history and configurations, kept at headquarters as one
append-only log of entries, each signed by the fleet key and chained to the one before.

- ``entry``: one entry (its kinds, canonical bytes, signature) and every size bound;
- ``state``: what the entries say (ships, groups, tokens, keys, configurations), and the
  one place an entry is taken in its place of the chain;
- ``log``: the registry's directory: the log file, appending, the fleet key;
- ``views``: the state as the files today's gateways and sites read (credentials, ship
  keys);
- ``bundle``: what a new ship carries on board;
- ``travel``: the entries as records of the system, published at headquarters;
- ``tokens``: a token's rotation ended by the ship's report naming its new token;
- ``follow``: a site's registry followed, verified and applied (gateway, Spark);
- ``shipconfig``: a ship's configuration on its way from a gateway to the ship (offer,
  request, the delta, the ship's checks);
- ``cli``: ``shorelink fleet ...``.

Pure Python, no Kafka: ``shorelink/kafka/registry.py`` publishes the records and feeds
a site's topic to ``follow`` (docs/fleet-registry.md, "How it travels").
"""

__all__ = [
    "bundle",
    "cli",
    "entry",
    "follow",
    "log",
    "shipconfig",
    "state",
    "tokens",
    "travel",
    "views",
]

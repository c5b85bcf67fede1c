"""The fleet simulator: ships sailing Tokyo -> Singapore -> Sydney and their container
sensors, published as MQTT to each ship's own broker (docs/fleet-sim.md). Not a
deployable: the voyage (``shorelink demo``) and tests use it; it imports nothing of
the project."""

from fleet_sim.iso6346 import check_digit, container_number, is_valid
from fleet_sim.plan import VoyagePlan, plan_voyage
from fleet_sim.publisher import FleetStats, mqtt_publish_bytes, run_fleet, ship_messages

__all__ = [
    "FleetStats",
    "VoyagePlan",
    "check_digit",
    "container_number",
    "is_valid",
    "mqtt_publish_bytes",
    "plan_voyage",
    "run_fleet",
    "ship_messages",
]

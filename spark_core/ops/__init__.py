"""The site's operations page (``shorelink ops``, docs/operations.md): what a port's
or headquarters' staff look at. ``follow`` reads the site's Kafka, ``view`` turns it,
the status files and the gateway's metrics into JSON, ``app`` serves the page, the API
and the live updates, ``coast`` draws the land from the coastlines shipped as its data."""

__all__ = ["app", "cli", "coast", "follow", "users", "view"]

"""``shorelink``: the project-level command (audit, consume, ship-key, dict, fleet; the
commands other installed packages add, such as the local stack's ``shorelink stack ...``).

The kernel imports nothing of the project above it. Another package extends this command
through two entry point groups (its pyproject's ``[project.entry-points."..."]``):

- ``shorelink.commands``: name -> a click command added to ``shorelink``;
- ``shorelink.options``: a command's name -> a click decorator that adds options to it.
  An option of ``audit`` that names a site's Kafka another way than ``--bootstrap`` (the
  local stack's ``--stack DIR``) leaves a ``site -> KafkaEndpoint`` function in
  ``ctx.meta[BOOTSTRAP_LOCATOR]``. ``--bootstrap`` alone is a Kafka without
  credentials (a development broker); a secured site's credentials come from its
  ``[sites.S.kafka]`` in ``--config``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from shorelink.cli_support import BOOTSTRAP_LOCATOR, fail, seq_bound, stream_seqs
from shorelink.errors import ShorelinkError
from shorelink.extras import missing_extra, needs_extra
from shorelink.files import write_atomic
from shorelink.fleet.cli import fleet, registry_option
from shorelink.fleet.rollout_cli import rollout
from shorelink.textout import table, wrap

if TYPE_CHECKING:
    from shorelink.fleet.rollout import Decision
    from shorelink.fleet.state import FleetState
    from shorelink.kafka.audit import SitesAudit, SourceAudit
    from shorelink.kafka.endpoint import KafkaEndpoint
    from shorelink.kafka.ship_reports import Reports
    from shorelink.kafka.sites import SiteKafka
    from shorelink.wire import WireRecord

__all__ = ["COMMANDS", "OPTIONS", "main", "render_audit", "render_sites_audit"]

COMMANDS = "shorelink.commands"
OPTIONS = "shorelink.options"


class _Shorelink(click.Group):
    """``shorelink``: each subcommand runs under ``needs_extra`` (a package its extra
    brings, missing here, is one line naming that extra, not a traceback). The commands
    and options other packages declare are loaded when a command line names them (or
    when every command is listed: ``--help``), so ``shorelink fleet status`` does not
    import the operations page, the local stack and their libraries first."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        _register(cmd_name)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        _register()
        return super().list_commands(ctx)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, cmd, rest = super().resolve_command(ctx, args)
        ctx.meta["shorelink.command"] = f"shorelink {name}"
        return name, cmd, rest

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except ImportError:
            with needs_extra(ctx.meta.get("shorelink.command", "shorelink")):
                raise


@click.group(cls=_Shorelink, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shorelink")
def main() -> None:
    """shorelink: every sensor reading from ship to every port and HQ, exactly once."""


@main.command()
@click.option(
    "--site",
    default=None,
    help="Site name (for the report; with --config or an option such as --stack, which "
    "site's Kafka). Not with --all-sites.",
)
@click.option("--bootstrap", default=None, help="The site's Kafka bootstrap (host:port).")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The sites file (sites.toml): the site's [sites.S.kafka] bootstrap; with "
    "--all-sites, every [sites.S] with its bootstrap and streams.",
)
@click.option(
    "--all-sites",
    is_flag=True,
    help="Compare every site of --config: per stream, identities one site holds and "
    "another lacks, and duplicates at any site. Exits 1 if any.",
)
@click.option("--stream", "streams", multiple=True, help="Only these streams (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def audit(
    ctx: click.Context,
    site: str | None,
    bootstrap: str | None,
    config_path: Path | None,
    all_sites: bool,
    streams: tuple[str, ...],
    as_json: bool,
) -> None:
    """Count identities in a site's canonical topics: per (origin, stream) the
    identities, duplicates and gaps. Exits 1 if any duplicate or gap is found.

    With --all-sites --config sites.toml: compare the canonical topics of every site."""
    from shorelink.kafka.audit import audit_site
    from shorelink.kafka.endpoint import name_clients

    name_clients(f"shorelink-audit-{site or 'all-sites'}")
    if all_sites:
        if config_path is None:
            fail(click.UsageError("--all-sites takes the sites from --config sites.toml"))
        if site is not None or bootstrap is not None:
            fail(
                click.UsageError(
                    "--all-sites compares every site: leave out --site and --bootstrap"
                )
            )
        _audit_all_sites(config_path, streams, as_json)
        return
    if site is None:
        fail(click.UsageError("give --site S (or --all-sites)"))
    locate: Callable[[str], KafkaEndpoint] | None = ctx.meta.get(BOOTSTRAP_LOCATOR)
    kafka = _plaintext(bootstrap) if bootstrap is not None else None
    if kafka is None and config_path is not None:
        kafka = _site_kafka(config_path, site).kafka
    if kafka is None and locate is not None:
        try:
            kafka = locate(site)
        except ShorelinkError as exc:
            fail(exc)
    if kafka is None:
        fail(
            click.UsageError(" or ".join(["give --bootstrap", *_added_options(audit), "--config"]))
        )
    try:
        results, malformed = audit_site(kafka, streams or None)
    except ShorelinkError as exc:
        fail(ShorelinkError(f"site {site}: {exc}"))
    bad = any(r.duplicates or r.gaps for r in results) or malformed > 0
    if as_json:
        click.echo(
            json.dumps(
                {
                    "site": site,
                    "sources": [r.to_json() for r in results],
                    "malformed": malformed,
                    "ok": not bad,
                },
                indent=2,
            )
        )
    else:
        for line in render_audit(site, results, malformed, ok=not bad):
            click.echo(line)
    if bad:
        sys.exit(1)


def _audit_all_sites(config_path: Path, streams: tuple[str, ...], as_json: bool) -> None:
    from shorelink.kafka.audit import audit_sites
    from shorelink.kafka.sites import load_sites

    try:
        sites = load_sites(config_path)
        report = audit_sites(
            {s.name: (s.kafka, s.streams) for s in sites.values()}, streams or None
        )
    except ShorelinkError as exc:
        fail(exc)
    if as_json:
        click.echo(json.dumps({"sites": list(sites), **report.to_json()}, indent=2))
    else:
        for line in render_sites_audit(report):
            click.echo(line)
    if not report.ok:
        sys.exit(1)


def render_audit(
    site: str,
    results: Sequence[SourceAudit],
    malformed: int,
    *,
    ok: bool,
    width: int | None = None,
) -> list[str]:
    """``shorelink audit`` as text that fits ``width`` (default: the terminal's, 80
    piped): a row per source; its gap ranges beside it, or under it when too long."""
    out = wrap(f"site {site}: {len(results)} sources, {malformed} malformed records", width)
    rows = [
        [
            r.origin,
            r.stream,
            str(r.identities),
            str(r.duplicates),
            str(r.gaps.count()),
            str(r.gaps),
        ]
        for r in results
    ]
    if rows:
        header = ["origin", "stream", "identities", "duplicates", "gaps", "gap ranges"]
        out += table(header, rows, width, right={2, 3, 4})
    out.append("OK: every identity once, no gaps" if ok else "NOT OK: duplicates or gaps found")
    return out


def render_sites_audit(report: SitesAudit, width: int | None = None) -> list[str]:
    """``shorelink audit --all-sites`` as text that fits ``width``: a row per stream and
    site, then each problem (the seqs a site lacks or repeats), wrapped."""
    rows = [
        [r.stream, r.site, *map(str, (r.records, r.identities, r.duplicates, r.missing_count))]
        for r in report.results
    ]
    header = ["stream", "site", "records", "identities", "duplicates", "missing"]
    out = table(header, rows, width, right={2, 3, 4, 5})
    for r in report.results:
        if not r.present:
            out += wrap(f"no canonical topic sl.{r.stream} at {r.site}", width)
    for problem in report.problems():
        out += wrap(problem, width, "", "  ")
    out.append(
        "OK: every site holds the same identities, each once"
        if report.ok
        else "NOT OK: identities missing at a site or duplicated"
    )
    return out


def _plaintext(bootstrap: str) -> KafkaEndpoint:
    """``--bootstrap HOST:PORT``: a Kafka without credentials (a development broker)."""
    from shorelink.kafka.endpoint import KafkaEndpoint

    return KafkaEndpoint.plaintext(bootstrap)


def _site_kafka(config_path: Path, site: str, stream: Iterable[str] = ()) -> SiteKafka:
    """``sites.<site>`` of the sites file (its Kafka and credentials), or exit 2
    saying why."""
    from shorelink.kafka.sites import load_sites

    try:
        sites = load_sites(config_path)
    except ShorelinkError as exc:
        fail(exc)
    found = sites.get(site)
    if found is None:
        fail(ShorelinkError(f"no site {site!r} in {config_path} (sites: {', '.join(sites)})"))
    for s in stream:
        if s not in found.streams:
            fail(
                ShorelinkError(
                    f"{s!r} is not a stream of site {site} in {config_path} "
                    f"(streams: {', '.join(found.streams)})"
                )
            )
    return found


@main.command()
@click.option("--site", required=True, help="The site to read (its name in --config).")
@click.option(
    "--stream",
    "streams",
    multiple=True,
    required=True,
    help="Stream to read, sl.<stream> (repeatable).",
)
@click.option(
    "--position",
    "position_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Position file (JSON): read at start if it exists, saved after each printed "
    "batch. The same file resumes at any other site. Without it: from the beginning.",
)
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new records.")
@click.option(
    "--customer",
    default=None,
    help="Read this customer's streams, sl.customer.<name>.<stream>, as a customer may "
    "(its credentials in the --config file's [sites.S.kafka]; docs/access-control.md).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The sites file (sites.toml): the site's Kafka is its [sites.S.kafka] bootstrap.",
)
@click.option(
    "--bootstrap", default=None, help="The site's Kafka (host:port), instead of --config."
)
@click.option(
    "--max",
    "max_records",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after printing this many records.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds the site's Kafka may take to answer at start.",
)
def consume(
    site: str,
    streams: tuple[str, ...],
    position_path: Path | None,
    follow: bool,
    customer: str | None,
    config_path: Path | None,
    bootstrap: str | None,
    max_records: int | None,
    timeout: float,
) -> None:
    """Print a site's canonical records as JSON lines (identity, key, value, ts, site,
    topic/partition/offset), skipping what the position has seen (docs/consumers.md).
    Without --follow, stops at the end of the topics. Exits 2 on a bad position file,
    an unknown site or a Kafka that does not answer."""
    from shorelink.kafka.consumer import PortableConsumer
    from shorelink.kafka.endpoint import name_clients
    from shorelink.kafka.position import FileStore

    name_clients(f"shorelink-consume-{site}")
    if (bootstrap is None) == (config_path is None):
        fail(click.UsageError("give one of --bootstrap HOST:PORT or --config sites.toml"))
    if bootstrap is not None:
        kafka = _plaintext(bootstrap)
    else:
        assert config_path is not None
        kafka = _site_kafka(config_path, site, () if customer else streams).kafka
    store = FileStore(position_path) if position_path is not None else None
    printed = skipped = 0
    try:
        consumer = PortableConsumer(
            kafka.with_timeout(timeout), list(streams), store=store, customer=customer
        )
        with consumer:
            while max_records is None or printed < max_records:
                want = consumer.batch_size
                if max_records is not None:
                    want = min(want, max_records - printed)
                batch = consumer.poll(want)
                if batch:
                    for c in batch:
                        click.echo(json.dumps(c.to_json(), separators=(",", ":")))
                    sys.stdout.flush()
                    consumer.commit()
                    printed += len(batch)
                elif consumer.caught_up and not follow:
                    break
                skipped = consumer.skipped
    except ShorelinkError as exc:
        fail(exc)
    except KeyboardInterrupt:
        pass  # what was printed is committed; the batch being printed comes again
    except BrokenPipeError:
        # the reader went away (``| head``): the unfinished batch is not committed
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    click.echo(
        f"site {site}: printed {printed} records, skipped {skipped} already seen",
        err=True,
    )


@main.group("ship-key")
def ship_key() -> None:
    """Ships' signing keys: each ship signs what it sends, every site checks it
    (docs/replication.md, "Ship signatures"). The ship keys file holds the public
    halves: copy it to every site (gateway.toml and sites.toml name it)."""


_KEYS_OPTION = click.option(
    "--ship-keys",
    "keys_path",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The ship keys file (TOML; created if missing).",
)


@ship_key.command("new")
@click.argument("ship")
@click.option(
    "--key-file",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="Where the ship's private key goes (mode 0600; never overwritten): copy it to "
    "the ship, as uplink.signing_key_file of its edge.toml.",
)
@_KEYS_OPTION
@click.option(
    "--replace",
    is_flag=True,
    help="The ship has a key in the file already: replace it (a lost key, a rotation). "
    "The old key stays in the file's history and still proves what it signed, at every "
    "seq unless --revoke.",
)
@click.option(
    "--revoke",
    is_flag=True,
    help="With --replace, the old key was stolen: it proves only records below the --from "
    "bounds, and is refused above them (at gateways and merges).",
)
@click.option(
    "--from",
    "revoke_from",
    multiple=True,
    metavar="[STREAM=]SEQ",
    help="With --revoke: the first seq the old key may not sign, per STREAM (repeatable; "
    "a stream not named is refused whole), or one SEQ for every stream. The ship's next "
    "seq when the key was lost (shorelink-edge status), or what sites hold (shorelink "
    "audit): the ship's records above it must carry the new key's proof.",
)
@click.option(
    "--require-signatures/--no-require-signatures",
    default=None,
    help="Also set whether ships without a key are refused (a new file: refused).",
)
@click.option(
    "--unsigned-below",
    "unsigned_below",
    multiple=True,
    metavar="STREAM=SEQ",
    help="A ship that sent before it had a key: its records of STREAM below SEQ (the "
    "ship's next seq now: shorelink-edge status) are taken without a proof where a site "
    "lacks them (repeatable).",
)
def ship_key_new(
    ship: str,
    key_file: Path,
    keys_path: Path,
    replace: bool,
    revoke: bool,
    revoke_from: tuple[str, ...],
    require_signatures: bool | None,
    unsigned_below: tuple[str, ...],
) -> None:
    """Make SHIP's signing key and add its public half to the ship keys file (with
    --replace, the old key goes to the ship's previous keys)."""
    from shorelink.files import locked
    from shorelink.identity import check_name
    from shorelink.proof import MAX_PREVIOUS_KEYS, PreviousKey, ShipKey, ShipKeys

    try:
        check_name("origin", ship)
        valid_below = _revoke_bound(replace, revoke, revoke_from)
        if key_file.exists():
            raise ShorelinkError(f"{key_file} exists: a ship's key is never overwritten")
        with locked(keys_path):
            keys = (
                ShipKeys.load(keys_path)
                if keys_path.exists()
                else ShipKeys(require_signatures=True)
            )
            if ship in keys.ships and not replace:
                raise ShorelinkError(
                    f"ship {ship} has a key in {keys_path} already (--replace to replace it)"
                )
            bounds = dict(keys.unsigned_below)
            bounds.pop(ship, None)
            if unsigned_below:
                bounds[ship] = stream_seqs(unsigned_below, "--unsigned-below")
            previous = dict(keys.previous)
            if ship in keys.ships:  # --replace: the old key, newest first, once
                old = keys.public_keys([ship])[ship]
                kept = [p for p in previous.get(ship, ()) if p.public != old]
                previous[ship] = (PreviousKey(old, keys.ships[ship], valid_below), *kept)
                if len(previous[ship]) > MAX_PREVIOUS_KEYS:
                    raise ShorelinkError(
                        f"ship {ship} has {MAX_PREVIOUS_KEYS} previous keys already: edit "
                        f"{keys_path} to drop the oldest (what they signed is then refused)"
                    )
            elif revoke:
                raise ShorelinkError(f"ship {ship} has no key in {keys_path} to revoke")
            key = ShipKey.generate()
            ships = {**keys.public_keys(), ship: key.public()}
            require = keys.require_signatures if require_signatures is None else require_signatures
            text = ShipKeys.render(ships, require, bounds, previous)
            ShipKeys.parse(tomllib.loads(text))  # what it writes reads back
            key.save(key_file)
            write_atomic(keys_path, text)
    except ShorelinkError as exc:
        fail(exc)
    click.echo(f"ship {ship}: private key in {key_file} (mode 0600), public key {key.public()}")
    click.echo(
        f"next: copy {key_file} to the ship (uplink.signing_key_file), and {keys_path} to "
        "every site (ship_keys_file of gateway.toml and sites.toml)"
    )


@ship_key.command("list")
@_KEYS_OPTION
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def ship_key_list(keys_path: Path, as_json: bool) -> None:
    """The ships with a key, and whether ships without one are refused."""
    from shorelink.proof import ShipKeys

    try:
        keys = ShipKeys.load(keys_path)
    except ShorelinkError as exc:
        fail(exc)
    public = keys.public_keys()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "require_signatures": keys.require_signatures,
                    "ships": public,
                    "unsigned_below": keys.unsigned_below,
                    "previous": {
                        s: [p.entry() for p in before] for s, before in keys.previous.items()
                    },
                }
            )
        )
        return
    if not public:
        click.echo(f"no ship has a key in {keys_path}")
    else:
        rows = [
            [
                s,
                k,
                ", ".join(
                    f"{st} < {n}" for st, n in sorted(keys.unsigned_below.get(s, {}).items())
                ),
            ]
            for s, k in sorted(public.items())
        ]
        for line in table(["ship", "public key", "taken unsigned"], rows):
            click.echo(line)
        history = [
            [s, p.public, _validity(p.valid_below)]
            for s, before in sorted(keys.previous.items())
            for p in before
        ]
        if history:
            click.echo("previous keys (what they signed stays provable):")
            for line in table(["ship", "previous key", "proves"], history):
                click.echo(line)
    refused = "refused" if keys.require_signatures else "taken unsigned"
    click.echo(f"ships without a key: {refused} (require_signatures)")


@ship_key.command("revoke")
@click.argument("ship")
@_KEYS_OPTION
@click.option(
    "--from",
    "revoke_from",
    multiple=True,
    required=True,
    metavar="[STREAM=]SEQ",
    help="The first seq the key may not sign, per STREAM (repeatable; a stream not named "
    "is refused whole), or one SEQ for every stream (--from 1: nothing it signed).",
)
@click.option(
    "--key",
    "public",
    metavar="PUBLIC_KEY",
    help="Which previous key (as `ship-key list` shows it); default: the most recent one.",
)
def ship_key_revoke(
    ship: str, keys_path: Path, revoke_from: tuple[str, ...], public: str | None
) -> None:
    """Bound a previous key of SHIP (replaced as lost, then found stolen): it proves
    only the records it signed below --from from then on. The current key is revoked
    by replacing it: `ship-key new SHIP --replace --revoke --from ...`."""
    from dataclasses import replace as replaced

    from shorelink.files import locked
    from shorelink.proof import ShipKeys

    try:
        bound = _revoke_bound(True, True, revoke_from)
        with locked(keys_path):
            keys = ShipKeys.load(keys_path)
            before = list(keys.previous.get(ship, ()))
            at = next((i for i, p in enumerate(before) if public in (None, p.public)), None)
            if at is None:
                which = f"no previous key {public}" if public else "no previous key"
                raise ShorelinkError(
                    f"ship {ship} has {which} in {keys_path} (a current key is revoked "
                    "with `ship-key new SHIP --replace --revoke --from ...`)"
                )
            before[at] = replaced(before[at], valid_below=bound)
            previous = {**keys.previous, ship: tuple(before)}
            text = ShipKeys.render(
                keys.public_keys(), keys.require_signatures, keys.unsigned_below, previous
            )
            ShipKeys.parse(tomllib.loads(text))  # what it writes reads back
            write_atomic(keys_path, text)
    except ShorelinkError as exc:
        fail(exc)
    click.echo(
        f"ship {ship}: previous key {before[at].public} proves {_validity(bound)}; copy "
        f"{keys_path} to every site"
    )


@ship_key.command("remove")
@click.argument("ship")
@_KEYS_OPTION
def ship_key_remove(ship: str, keys_path: Path) -> None:
    """Take SHIP's key out of the ship keys file (a ship leaving the fleet)."""
    from shorelink.files import locked
    from shorelink.proof import ShipKeys

    try:
        with locked(keys_path):
            keys = ShipKeys.load(keys_path)
            ships = keys.public_keys()
            if ships.pop(ship, None) is None:
                raise ShorelinkError(f"ship {ship} has no key in {keys_path}")
            bounds = {s: b for s, b in keys.unsigned_below.items() if s != ship}
            previous = {s: p for s, p in keys.previous.items() if s != ship}
            write_atomic(
                keys_path, ShipKeys.render(ships, keys.require_signatures, bounds, previous)
            )
    except ShorelinkError as exc:
        fail(exc)
    click.echo(f"ship {ship}: key removed from {keys_path}; copy the file to every site")
    if not keys.require_signatures:  # review N10: said, not silent
        click.echo(
            f"warning: require_signatures = false in {keys_path}: ship {ship} is now taken "
            "UNSIGNED at every site (its batches and any record a neighbour offers in its "
            "name); set require_signatures = true to refuse it instead",
            err=True,
        )


def _revoke_bound(replace: bool, revoke: bool, items: Sequence[str]) -> int | dict[str, int] | None:
    """The old key's ``valid_below`` that ``--revoke --from ...`` give (None: the old
    key proves every seq); a ShorelinkError for options that do not go together."""
    if revoke and not replace:
        raise ShorelinkError("--revoke goes with --replace (it is the old key that is revoked)")
    if items and not revoke:
        raise ShorelinkError("--from bounds a revoked key: give --revoke with it")
    if not revoke:
        return None
    if not items:
        raise ShorelinkError(
            "--revoke needs --from [STREAM=]SEQ: the first seq the old key may not sign (the "
            "ship's next seq when the key was lost: shorelink-edge status; --from 1 refuses "
            "everything it signed)"
        )
    return seq_bound(items, "--from")


def _validity(valid_below: int | Mapping[str, int] | None) -> str:
    if valid_below is None:
        return "every seq"
    if isinstance(valid_below, int):
        return f"seq < {valid_below}"
    named = ", ".join(f"{st} < {n}" for st, n in sorted(valid_below.items()))
    return f"{named}; no other stream"


_ADDED: dict[str, list[str]] = {}


@fleet.command("publish")
@registry_option()
@click.option(
    "--sites",
    "sites_file",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The sites file (sites.toml): where the site's Kafka is and how to log in.",
)
@click.option("--site", required=True, help="Headquarters' site in the sites file.")
def fleet_publish(directory: Path, sites_file: Path, site: str) -> None:
    """Write every entry the site's sl.registry lacks into its sl.ingress.registry: the
    merge and replication carry them to every site, exactly once (docs/fleet-registry.md,
    "How it travels"). Publishing again writes nothing twice."""
    from shorelink.fleet.log import Registry
    from shorelink.kafka.registry import publish

    s = _site_kafka(sites_file, site)
    try:
        reg = Registry.open(directory)
        versions = publish(reg, s.kafka, site, s.durability)
    except ShorelinkError as exc:
        fail(exc)
    version = reg.state.version
    if not versions:
        click.echo(f"registry version {version}: {site} holds every entry already")
        return
    click.echo(
        f"registry version {version}: entries {versions[0]}-{versions[-1]} published to {site}"
    )


def _reports_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Where ``fleet status``, ``fleet rollout status`` and ``tick`` read the ships'
    reports: ``--kafka`` or ``--sites`` and ``--site``; the report stream."""
    options = [
        click.option(
            "--kafka",
            "bootstrap",
            metavar="BOOTSTRAP",
            help="Read the ships' reports at this Kafka (no credentials: a development broker).",
        ),
        click.option(
            "--sites",
            "sites_file",
            type=click.Path(path_type=Path, dir_okay=False),
            help="Or at --site of this sites file (its Kafka and credentials).",
        ),
        click.option("--site", help="The site in --sites (headquarters')."),
        click.option(
            "--report-stream",
            default="agent",
            show_default=True,
            help="The ships' report stream ([report] stream of edge.toml).",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _read_reports(
    bootstrap: str | None, sites_file: Path | None, site: str | None, stream: str
) -> Reports | None:
    """Every ship's newest report at the Kafka named (None: none was named)."""
    from shorelink.kafka.endpoint import KafkaEndpoint
    from shorelink.kafka.ship_reports import newest_reports

    if bootstrap is None and sites_file is None:
        if site is not None:
            fail(ShorelinkError("--site names a site of --sites FILE: give --sites too"))
        return None
    if bootstrap is not None and sites_file is not None:
        fail(ShorelinkError("give --kafka or --sites, not both"))
    if sites_file is not None and site is None:
        fail(ShorelinkError("--sites needs --site: headquarters' site in it"))
    kafka = (
        KafkaEndpoint.plaintext(bootstrap)
        if bootstrap is not None
        else _site_kafka(sites_file, site).kafka  # type: ignore[arg-type]
    )
    try:
        return newest_reports(kafka, stream)
    except ShorelinkError as exc:
        fail(exc)


def _fleet_view(
    directory: Path, bootstrap: str | None, sites_file: Path | None, site: str | None, stream: str
) -> tuple[FleetState, dict[str, dict[str, Any]] | None, dict[int, Decision]]:
    """The registry's state and, with the reports named, each ship's health and what
    they decide for each active rollout."""
    from shorelink.fleet.health import FleetView, decisions, fleet_health, heard_from
    from shorelink.fleet.log import Registry

    try:
        state = Registry.open(directory).state
    except ShorelinkError as exc:
        fail(exc)
    found = _read_reports(bootstrap, sites_file, site, stream)
    if found is None:
        return state, None, {}
    heard, view = heard_from(found.reports), FleetView.of(state)
    health = fleet_health(view, heard, found.heard_ms, int(time.time() * 1000))
    return state, health, decisions(view, heard)


@fleet.command("status")
@registry_option()
@_reports_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fleet_status(
    directory: Path,
    bootstrap: str | None,
    sites_file: Path | None,
    site: str | None,
    report_stream: str,
    as_json: bool,
) -> None:
    """Every ship: its groups, its token's state, the configuration version it should
    run (rollouts honoured), its key ids (each previous one with the seq it proves
    below); with the ships' reports (--kafka or --sites) the version each runs, its
    health and when it was last heard of, and every rollout under way."""
    from shorelink.fleet.cli import render_status, status_json
    from shorelink.fleet.health import rollout_json
    from shorelink.fleet.rollout_cli import render_rollouts

    state, health, decided = _fleet_view(directory, bootstrap, sites_file, site, report_stream)
    if as_json:
        out = status_json(state, health)
        out["rollouts"] = [
            rollout_json(state.rollouts[r], decided.get(r))
            for r in sorted(state.active_rollouts.values())
        ]
        click.echo(json.dumps(out))
        return
    lines = render_status(state, health=health) + render_rollouts(state, decided, True)
    click.echo("\n".join(lines))


@fleet.command("audit-key")
@click.argument("ship")
@click.argument("key_id")
@registry_option()
@click.option(
    "--kafka",
    "bootstrap",
    metavar="BOOTSTRAP",
    help="Read what this Kafka holds under the key (no credentials: a development broker).",
)
@click.option(
    "--sites",
    "sites_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Or at --site of this sites file (its Kafka and credentials).",
)
@click.option("--site", help="The site in --sites.")
@click.option(
    "--stream",
    "streams",
    multiple=True,
    help="A stream to read (repeatable; default: every canonical topic at the Kafka).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fleet_audit_key(
    ship: str,
    key_id: str,
    directory: Path,
    bootstrap: str | None,
    sites_file: Path | None,
    site: str | None,
    streams: tuple[str, ...],
    as_json: bool,
) -> None:
    """What SHIP's key KEY_ID may sign, per stream: the seqs from its from_seq up to
    the next key's, lowered by a revocation; with --kafka or --sites, what the site
    holds that it signed (each record's sl.proof names its key) and what the site
    refused of it (its dead letters, by cause: a revoked key's records above its
    bound)."""
    from shorelink.fleet.key_audit import key_validity
    from shorelink.fleet.log import Registry
    from shorelink.kafka.endpoint import KafkaEndpoint
    from shorelink.kafka.key_audit import canonical_streams, key_holdings

    try:
        validity = key_validity(Registry.open(directory).state, ship, key_id)
    except ShorelinkError as exc:
        fail(exc)
    if bootstrap is not None and sites_file is not None:
        fail(ShorelinkError("give --kafka or --sites, not both"))
    if (sites_file is None) != (site is None):
        fail(ShorelinkError("--sites and --site go together"))
    held = None
    if bootstrap is not None or sites_file is not None:
        kafka = (
            KafkaEndpoint.plaintext(bootstrap)
            if bootstrap is not None
            else _site_kafka(sites_file, site).kafka  # type: ignore[arg-type]
        )
        try:
            held = key_holdings(kafka, ship, key_id, streams or canonical_streams(kafka))
        except ShorelinkError as exc:
            fail(exc)
    key = validity.key
    out: dict[str, Any] = {
        "ship": ship,
        "key": key.id,
        "index": validity.index,
        "keys": validity.keys,
        "added_version": key.version,
        "from_seq": key.from_seq,
        "revoked_at": key.revoked_at,
        "proves": {s: list(r) for s, r in validity.ranges.items()},
    }
    if held is not None:
        out["held"] = {
            s: {
                "signed": str(h.signed),
                "refused": {c: str(r) for c, r in sorted(h.refused.items())},
                "without_key_id": h.without_key_id,
                "other_keys": dict(h.other_keys),
            }
            for s, h in held.items()
        }
    if as_json:
        click.echo(json.dumps(out))
        return

    def seqs(lo: int, hi: int | None) -> str:
        if hi is not None and hi <= lo:
            return "none"
        return f"{lo}-{hi - 1}" if hi is not None else f"{lo} on"

    at = key.revoked_at
    bound = (
        at if isinstance(at, int) else " ".join(f"{s}={n}" for s, n in sorted((at or {}).items()))
    )
    revoked = "" if at is None else f", revoked at {bound}"
    lines = [
        f"ship {ship} key {key.id}: its key {validity.index} of {validity.keys}, added at "
        f"registry version {key.version}{revoked}",
        "proves (registry):",
        *(f"  {s}: {seqs(lo, hi)}" for s, (lo, hi) in validity.ranges.items()),
    ]
    if held is not None:
        lines.append("at the site:")
        for s, h in held.items():
            refused = "; ".join(f"{c} {r}" for c, r in sorted(h.refused.items())) or "none"
            lines.append(f"  {s}: signed {h.signed or 'none'}; refused {refused}")
            if h.without_key_id or h.other_keys:
                lines.append(
                    f"    (and {h.without_key_id} of the ship's records without a key id, "
                    f"{sum(h.other_keys.values())} of its other keys)"
                )
    click.echo("\n".join(lines))


@rollout.command("status")
@registry_option()
@_reports_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def rollout_status(
    directory: Path,
    bootstrap: str | None,
    sites_file: Path | None,
    site: str | None,
    report_stream: str,
    as_json: bool,
) -> None:
    """Every rollout: its stage and ships, and with the ships' reports (--kafka or
    --sites) what `tick` would decide and each reached ship's state."""
    from shorelink.fleet.health import rollout_json
    from shorelink.fleet.rollout_cli import render_rollouts

    state, _, decided = _fleet_view(directory, bootstrap, sites_file, site, report_stream)
    if as_json:
        rows = [rollout_json(state.rollouts[r], decided.get(r)) for r in sorted(state.rollouts)]
        click.echo(json.dumps(rows))
        return
    click.echo("\n".join(render_rollouts(state, decided) or ["no rollouts"]))


@rollout.command("tick")
@registry_option()
@_reports_options
def rollout_tick(
    directory: Path,
    bootstrap: str | None,
    sites_file: Path | None,
    site: str | None,
    report_stream: str,
) -> None:
    """Read the ships' newest reports and write what they decide for every active
    rollout: advanced, done or stopped (entries signed by the fleet key), or held. Run
    it every report interval (a timer), then `fleet publish`."""
    from shorelink.fleet.health import heard_from
    from shorelink.fleet.log import Registry
    from shorelink.fleet.rollout_cli import tick

    found = _read_reports(bootstrap, sites_file, site, report_stream)
    if found is None:
        fail(ShorelinkError("tick reads the ships' reports: give --kafka or --sites and --site"))
    try:
        lines = tick(Registry.open(directory), heard_from(found.reports))
    except ShorelinkError as exc:
        fail(exc)
    click.echo("\n".join(lines or ["no rollout under way"]))
    if any(": held: " not in line for line in lines):
        click.echo("next: `shorelink fleet publish` carries the change to every site")


@fleet.command("run")
@registry_option()
@click.option(
    "--sites",
    "sites_file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The sites file (sites.toml): headquarters' Kafka and how to log in.",
)
@click.option(
    "--kafka",
    "bootstrap",
    metavar="BOOTSTRAP",
    help="Or this Kafka (no credentials: a development broker).",
)
@click.option("--site", required=True, help="Headquarters' site (in --sites).")
@click.option(
    "--tick-every",
    default="30s",
    show_default=True,
    help="How often the ships' reports decide the rollouts (a report interval; 0: never).",
)
@click.option(
    "--check-every",
    default="1s",
    show_default=True,
    help="How often the registry's log is looked at for new entries to publish.",
)
@click.option(
    "--report-stream",
    default="agent",
    show_default=True,
    help="The ships' report stream ([report] stream of edge.toml).",
)
@click.option("--once", is_flag=True, help="One turn (publish, tick, publish), then exit.")
@click.option("--log-level", default="info", show_default=True, help="debug, info, warning.")
@click.option("--log-json", is_flag=True, help="Log JSON lines instead of logfmt.")
def fleet_run(
    directory: Path,
    sites_file: Path | None,
    bootstrap: str | None,
    site: str,
    tick_every: str,
    check_every: str,
    report_stream: str,
    once: bool,
    log_level: str,
    log_json: bool,
) -> None:
    """Headquarters' loop: publish every new registry entry to the site's
    sl.ingress.registry within --check-every of its writing, and tick the rollouts on
    the ships' reports every --tick-every (what `fleet publish` and `fleet rollout tick`
    do by hand), retiring the tokens the ships' reports show replaced. With --sites it
    logs in as [sites.SITE.access] fleet_username (its own principal: `shorelink-spark
    access apply`) when the file names fleet_password, else as [sites.SITE.kafka].
    Stops cleanly on SIGTERM or Ctrl-C."""
    import signal

    from shorelink.config import parse_duration
    from shorelink.kafka.endpoint import KafkaEndpoint
    from shorelink.kafka.fleet_run import HeadquartersLoop
    from shorelink.logs import configure_logging

    if (bootstrap is None) == (sites_file is None):
        fail(ShorelinkError("give --sites FILE (with --site) or --kafka BOOTSTRAP"))
    try:
        numeric = {t: float(t) for t in (tick_every, check_every) if t.isdigit()}
        tick_s = parse_duration(numeric.get(tick_every, tick_every), "--tick-every")
        check_s = parse_duration(numeric.get(check_every, check_every), "--check-every")
        check_s = max(0.05, check_s)
    except ShorelinkError as exc:
        fail(exc)
    if sites_file is not None:
        from shorelink.kafka.sites import fleet_login

        s = _site_kafka(sites_file, site)
        kafka, durability = s.kafka, s.durability
        try:
            own = fleet_login(sites_file, site)
        except ShorelinkError as exc:
            fail(exc)
        if own is not None:  # its own principal (access apply), not the site's application
            kafka = kafka.as_user(*own)
    else:
        kafka, durability = KafkaEndpoint.plaintext(bootstrap), None  # type: ignore[arg-type]
    configure_logging(log_level, as_json=log_json)
    loop = HeadquartersLoop(directory, kafka, site, durability, report_stream, tick_s, check_s)
    if once:
        try:
            loop.step()
        except ShorelinkError as exc:
            fail(exc)
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: loop.stop.set())
    loop.run()


main.add_command(fleet)


@main.group("dict")
def dictionaries() -> None:
    """The batch bodies' zstd dictionaries, one per stream (docs/wire-format.md,
    "Dictionaries"): trained here at headquarters on what ships sent, copied to every
    gateway's dictionaries_dir first, then to ships' uplink.dictionaries_dir."""


@dictionaries.command("train")
@click.option(
    "--records",
    "records_paths",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    multiple=True,
    required=True,
    help="What ships sent, as JSON lines of `shorelink consume` (e.g. `shorelink consume "
    "--config sites.toml --site hq --stream containers --max 50000 > c.jsonl`); '-' for "
    "stdin (repeatable).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Where the dictionaries go (<stream>-<id>.zdict, mode 0600; the directory is "
    "made 0700 if missing). Ids grow from those already there.",
)
@click.option("--stream", "streams", multiple=True, help="Only these streams (repeatable).")
@click.option("--ship", "ships", multiple=True, help="Only these ships' records (repeatable).")
@click.option(
    "--batch-records",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="Train on bodies of batches this size (the satellite's: 200), and of one record.",
)
@click.option(
    "--size",
    "size",
    type=click.IntRange(min=1024, max=1024 * 1024),
    default=32 * 1024,
    show_default=True,
    help="Bytes of each dictionary (carried to every ship once).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def dict_train(
    records_paths: tuple[Path, ...],
    out_dir: Path,
    streams: tuple[str, ...],
    ships: tuple[str, ...],
    batch_records: int,
    size: int,
    as_json: bool,
) -> None:
    """Train one dictionary per stream on the batch bodies the encoder builds of its
    records (per ship, in seq order), write each as <stream>-<id>.zdict in --out and
    print its id, size and what it was trained on. Exits 2 on unreadable input or a
    stream zstd cannot train on (too few records)."""
    import time

    from shorelink.wire_dict import Dictionaries, next_id, train, training_samples

    by_stream = _consumed_records(records_paths, set(streams), set(ships))
    if not by_stream:
        fail(ShorelinkError("no records to train on (check --stream and --ship)"))
    try:
        out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        ids = Dictionaries.load(out_dir, "--out").ids()
    except (OSError, ShorelinkError) as exc:
        fail(exc if isinstance(exc, ShorelinkError) else ShorelinkError(f"--out: {exc}"))
    made: list[dict[str, Any]] = []
    for stream, per_ship in sorted(by_stream.items()):
        t0 = time.monotonic()
        dict_id = next_id(ids)
        try:
            samples = [
                sample
                for recs in per_ship.values()
                for sample in training_samples(sorted(recs, key=lambda r: r.seq), batch_records)
            ]
            d = train(stream, samples, dict_id=dict_id, size=size)
            path = d.write(out_dir)
        except (ValueError, OSError, ShorelinkError) as exc:
            fail(ShorelinkError(f"stream {stream}: {exc}"))
        ids.append(dict_id)
        made.append(
            {
                "stream": stream,
                "id": dict_id,
                "bytes": len(d.data),
                "records": sum(map(len, per_ship.values())),
                "ships": len(per_ship),
                "samples": len(samples),
                "train_s": round(time.monotonic() - t0, 2),
                "file": str(path),
            }
        )
    if as_json:
        click.echo(json.dumps({"dictionaries": made}, indent=2))
        return
    rows = [
        [m["stream"], str(m["id"]), f"{m['bytes']:,}", f"{m['records']:,}", str(m["ships"]),
         str(m["samples"]), f"{m['train_s']:.1f}", m["file"]]
        for m in made
    ]  # fmt: skip
    header = ["stream", "id", "bytes", "records", "ships", "samples", "train s", "file"]
    for line in table(header, rows):
        click.echo(line)
    click.echo(
        "copy the files to every gateway's dictionaries_dir first, then to"
        " the ships' uplink.dictionaries_dir"
    )


def _consumed_records(
    paths: Sequence[Path], streams: set[str], ships: set[str]
) -> dict[str, dict[str, list[WireRecord]]]:
    """stream -> ship -> its records, from JSON lines of ``shorelink consume`` (exit 2
    naming the file and line of one that is not such a record)."""
    from shorelink.wire_dict import consumed_record

    out: dict[str, dict[str, list[WireRecord]]] = {}
    for path in paths:
        name = "stdin" if str(path) == "-" else str(path)
        try:
            with sys.stdin.buffer if str(path) == "-" else path.open("rb") as f:
                for n, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        ship, stream, record = consumed_record(line)
                    except ValueError as exc:
                        fail(ShorelinkError(f"{name}:{n}: not a line of shorelink consume: {exc}"))
                    if (streams and stream not in streams) or (ships and ship not in ships):
                        continue
                    out.setdefault(stream, {}).setdefault(ship, []).append(record)
        except OSError as exc:
            fail(ShorelinkError(f"{name}: {exc.strerror or exc}"))
    return out


def _added_options(cmd: click.Command) -> list[str]:
    """The options other packages added to ``cmd`` (their first spelling each)."""
    return _ADDED.get(cmd.name or "", [])


def _missing(name: str, exc: ImportError) -> click.Command:
    """A command whose package is installed without what it needs (a lean install,
    docs/install.md): it says so, naming the extra that brings it, instead of the whole
    ``shorelink`` failing."""
    error = missing_extra(f"shorelink {name}", exc) or ShorelinkError(
        f"`shorelink {name}` needs a package this install lacks ({exc})"
    )

    @click.command(
        name,
        help=f"(not available here: {error})",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def missing() -> None:
        fail(error)

    return missing


#: the names whose entry points (commands, and options of a command) are loaded (None:
#: every name's), and the commands whose added options are in place
_LOADED: set[str | None] = set()
_LOADED_OPTIONS: set[str] = set()


def _register(name: str | None = None) -> None:
    """Add the commands and options that installed packages declare for ``name``
    (None: for every name); one whose package cannot be imported here becomes a
    command that says what is missing. Each name is loaded once."""
    if name in _LOADED or None in _LOADED:
        return
    _LOADED.add(name)
    for ep in entry_points(group=COMMANDS):
        if name not in (None, ep.name) or ep.name in main.commands:
            continue
        try:
            main.add_command(ep.load(), ep.name)
        except ImportError as exc:
            main.add_command(_missing(ep.name, exc), ep.name)
    for ep in entry_points(group=OPTIONS):
        if name not in (None, ep.name) or ep.name in _LOADED_OPTIONS:
            continue
        _LOADED_OPTIONS.add(ep.name)
        cmd = main.commands[ep.name]
        before = len(cmd.params)
        try:
            ep.load()(cmd)
        except ImportError:
            continue  # an option of a package this install lacks: the command works without
        _ADDED.setdefault(ep.name, []).extend(p.opts[0] for p in cmd.params[before:])


if __name__ == "__main__":
    main()

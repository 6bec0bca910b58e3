"""``factory sandbox``: build the docker backend's image and check backends."""

from __future__ import annotations

import dataclasses

import click

from factory.cli._options import dump_json, json_option

__all__ = ["sandbox"]


@click.group()
def sandbox() -> None:
    """Build the docker sandbox's image and run the sandbox conformance suite."""


def _tag(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from factory.tasks import check_image_reference

    try:
        return None if value is None else check_image_reference(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@sandbox.command("build-image")
@click.option("--tag", default=None, metavar="TAG", callback=_tag,
              help="Image tag (default: factory-sandbox:pyX.Y of this Python; factory-sandbox-browser:pyX.Y "
                   "with --browser).")
@click.option("--browser", is_flag=True,
              help="Build the browser image instead: Chromium, fonts and Playwright added, for the browser verifier "
                   "on docker (about 850 MB; the default image stays small).")
@json_option
def build_image_command(tag: str | None, browser: bool, as_json: bool) -> None:
    """Build the docker sandbox's image from this host, offline, and smoke-test it.

    The image holds this host's Python relocated to /usr/local, pytest and its
    dependencies, and a small Debian userland (shell, coreutils, awk, ...)
    copied from the installed packages; no registry or network is used.
    With --browser it adds this host's Debian chromium (and the packages it
    declares), fonts, and Playwright's Python client with its driver.
    Progress goes to stderr.
    """
    from factory.sandbox import build_image

    build = build_image(tag, progress=lambda line: click.echo(line, err=True), browser=browser)
    if as_json:
        click.echo(dump_json(dataclasses.asdict(build)))
        return
    click.echo(
        f"built {build.tag} ({build.image_id[:19]}): {build.size_bytes / 1e6:.1f} MB, "
        f"python {build.python_version}, pytest {build.pytest_version}, "
        f"{len(build.packages)} Debian packages, {build.seconds:.1f} s"
    )


@sandbox.command()
@click.argument("backend")
@json_option
def check(backend: str, as_json: bool) -> None:
    """Run the sandbox conformance suite against BACKEND (bwrap, docker, none, ...).

    Prints one line per check (status, name, detail) and exits with status 1
    if any check failed; a check the backend does not claim is skipped.
    """
    import asyncio

    from factory.sandbox import self_check

    results = asyncio.run(self_check(backend))
    if as_json:
        click.echo(dump_json({"backend": backend, "checks": [dataclasses.asdict(r) for r in results]}))
    else:
        width = max((len(r.name) for r in results), default=0)
        for result in results:
            click.echo(f"{result.status:<7}  {result.name:<{width}}  {result.detail}".rstrip())
        counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "skipped")}
        click.echo(f"{backend}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    if any(r.status == "failed" for r in results):
        raise SystemExit(1)

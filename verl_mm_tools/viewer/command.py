"""The ``verl-mm-tools view DIR [--out SITE] [--serve PORT]`` sub-command."""

from __future__ import annotations

import argparse
import sys
from typing import cast

from verl_mm_tools.cli_types import whole_number

VIEW_HELP = "write a static HTML site of dumped trajectories (and optionally serve it on localhost)"


def add_view_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``view`` on the CLI's sub-parsers."""
    view = commands.add_parser("view", help=VIEW_HELP, description=VIEW_HELP)
    view.add_argument("dir", help="the mm_tool loop's dump_dir, or verl's trainer.rollout_data_dir (JSONL, text only)")
    view.add_argument("--out", help="directory of the site (default: DIR/_site; replaced on every run)")
    view.add_argument(
        "--serve",
        type=whole_number(0, 65535),
        metavar="PORT",
        help="then serve the site on http://127.0.0.1:PORT/ until Ctrl-C (0: any free port)",
    )
    view.add_argument("--strict", action="store_true", help="exit 1 if any record could not be read (after the site)")
    view.set_defaults(run=run_view)


def run_view(args: argparse.Namespace) -> int:
    from verl_mm_tools.viewer.loading import ViewerError
    from verl_mm_tools.viewer.site import build_site, make_server

    try:
        site = build_site(args.dir, args.out)
        for bad in site.bad:
            sys.stderr.write(f"verl-mm-tools view: left out {bad.line()}\n")
        left_out = f" ({len(site.bad)} records left out, listed on the index page)" if site.bad else ""
        sys.stdout.write(f"{len(site.pages)} trajectories: {site.index}{left_out}\n")
        if args.serve is None:
            return 1 if args.strict and site.bad else 0
        server = make_server(site.index.parent, args.serve)
    except ViewerError as error:
        sys.stderr.write(f"verl-mm-tools view: {error}\n")
        return 2
    host, port = cast("tuple[str, int]", server.server_address[:2])  # an AF_INET server: (host, port)
    sys.stdout.write(f"serving http://{host}:{port}/ (Ctrl-C to stop)\n")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0

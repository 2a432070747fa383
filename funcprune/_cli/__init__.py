"""The ``funcprune`` command line (the door): ``oneshot``, ``structured``, ``eval``, ``report`` and ``demo``.

``_main.py`` parses (argparse subcommands) and turns bad input into one
line and exit code 2; ``_options.py`` declares every option once, for the
flags and the recipe files; ``_checkpoint.py`` checks and loads the
checkpoint read and stages the directory written; ``_data.py`` turns text
files into token windows; ``_oneshot.py``, ``_structured.py`` and
``_inspect.py`` run the commands; ``_report.py`` builds ``report.json``;
``_progress.py`` draws the bars. It sits on top of the package: it imports
the public ``funcprune`` names and the rooms' doors, and nothing imports it.
"""

from ._main import main as main
from ._main import parser as parser

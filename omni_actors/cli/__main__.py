"""``python -m omni_actors.cli``: the same as the ``omni-actors`` command."""

import sys

from omni_actors.cli import main

sys.exit(main())

"""`python -m weight_teleport.cli`: the `weight-teleport` command."""

import sys

from weight_teleport.cli import main

sys.exit(main())

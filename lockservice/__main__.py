"""`python -m lockservice serve|inspect|revoke|bump-epoch` (see lockservice.cli)."""

import sys

from lockservice.cli import main

sys.exit(main())

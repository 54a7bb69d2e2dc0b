import sys

from flashscale.cli import main

sys.exit(main())

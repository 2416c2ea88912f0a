import sys

from autobatch.cli import main

sys.exit(main())

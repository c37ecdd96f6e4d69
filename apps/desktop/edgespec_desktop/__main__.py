import sys

from edgespec_desktop.app import main

sys.exit(main())

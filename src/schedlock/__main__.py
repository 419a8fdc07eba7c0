import sys

from schedlock.cli import main

sys.exit(main())

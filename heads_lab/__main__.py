from heads_lab.cli import main

raise SystemExit(main())

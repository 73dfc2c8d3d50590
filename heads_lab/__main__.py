from heads_lab.commands.cli import main

raise SystemExit(main())

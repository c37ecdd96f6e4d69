from edgespec.cli import main

main()

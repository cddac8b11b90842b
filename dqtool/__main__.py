from dqtool.cli import main

main()

from dqtool.cli import entry

entry()

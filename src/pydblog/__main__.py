from pydblog.cli import main

main()

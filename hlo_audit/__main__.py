from hlo_audit.cli import main

main()

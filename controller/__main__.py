from outbox.controller.cli import main

main()

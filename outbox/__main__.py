from outbox.entry import main

main()

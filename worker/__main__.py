from outbox.extras import worker

worker()

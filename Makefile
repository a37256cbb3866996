# The commands the README shows; each goes through dev.py, which needs nothing but Python.
.PHONY: demo test test-slow test-lowest test-pythons pythons lint bench wheel-demo release-check docs celery-suite battle-valkey battle-rabbitmq
demo:
	python3 dev.py demo
test:
	python3 dev.py test
# The suite with the tests marked slow too (before a release).
test-slow:
	python3 dev.py test --slow
test-lowest:
	python3 dev.py test-lowest -m "not e2e"
# The Redis-level tests on each supported Python but the one that runs dev.py (whose `make test` covers it).
test-pythons:
	python3 dev.py test-python 3.12 -m "not e2e"
	python3 dev.py test-python 3.13 -m "not e2e"
pythons:
	python3 dev.py pythons
lint:
	python3 dev.py lint
bench:
	python3 dev.py bench
wheel-demo:
	python3 dev.py wheel-demo --python 3.11,3.12,3.13
release-check:
	python3 dev.py release-check
docs:
	python3 dev.py docs
celery-suite:
	python3 dev.py celery-suite
# The three-minute battle on Valkey that CI leaves out for time (.ci/run runs the one on Redis).
battle-valkey:
	python3 dev.py battle --minutes 3 --rate 100 --countdown-scale 0.05 --visibility-timeout 60 --seed 37 \
		--workers prefork:2,prefork:2,threads:4 --track-due-now --server valkey
# The same battle with a RabbitMQ node as the broker (docs/rabbitmq.rst); add --plain for plain Celery's twin.
battle-rabbitmq:
	python3 dev.py battle --minutes 3 --rate 100 --countdown-scale 0.05 --visibility-timeout 60 --seed 37 \
		--workers prefork:2,prefork:2,threads:4 --broker rabbitmq

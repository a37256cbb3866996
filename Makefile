# The commands the README shows; each goes through dev.py, which needs nothing but Python.
.PHONY: demo test test-lowest lint bench wheel-demo docs celery-suite
demo:
	python3 dev.py demo
test:
	python3 dev.py test
test-lowest:
	python3 dev.py test-lowest -m "not e2e"
lint:
	python3 dev.py lint
bench:
	python3 dev.py bench
wheel-demo:
	python3 dev.py wheel-demo
docs:
	python3 dev.py docs
celery-suite:
	python3 dev.py celery-suite

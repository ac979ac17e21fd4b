# Entry points; the real work is in scripts/.
.PHONY: demo test
demo:
	scripts/demo.sh $(ARGS)
test:
	scripts/test.sh $(ARGS)

# Entry points; the real work is in scripts/.
.PHONY: demo test images
demo:
	scripts/demo.sh $(ARGS)
test:
	scripts/test.sh $(ARGS)
# the node, hub and singleuser images, for this machine, with docker or podman
images:
	scripts/images.sh

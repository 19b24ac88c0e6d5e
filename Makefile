# relayd — run `make help` for the targets.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
GO      ?= go

# `make run` talks to local services (compose.yaml, or the machine's own)
# unless RELAY_DATABASE_URL is set.
LOCAL_DATABASE_URL ?= postgres://root@127.0.0.1:5432/test?sslmode=disable

.PHONY: help build run tail test test-short lint bench bench-horizon up down clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build bin/relayd
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/relayd ./cmd/relayd

run: build ## migrate and run relayd against the local services (creates stream and exchange)
	RELAY_DATABASE_URL="$${RELAY_DATABASE_URL:-$(LOCAL_DATABASE_URL)}" RELAY_PROVISION=true ./bin/relayd run

tail: build ## print each message reaching the local stream and exchange until Ctrl-C (beside `make run`)
	./bin/relayd tail

# The Node example consumer's dependencies, from its lockfile, for its tests
# (which skip without node); where npm is missing they fail, naming npm ci.
NODE_EXAMPLE := examples/consumers/node
NODE_DEPS    := $(NODE_EXAMPLE)/node_modules/.package-lock.json
$(NODE_DEPS): $(NODE_EXAMPLE)/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix $(NODE_EXAMPLE) --no-audit --no-fund; fi

# ./integration/ first: go test starts packages in the order given, and the
# longest one, started last, is the run's critical path.
test: $(NODE_DEPS) ## run every test, with the race detector, against the real services
	$(GO) test -race -count=1 -timeout 20m ./integration/ ./...

test-short: $(NODE_DEPS) ## unit tests only (no services needed)
	$(GO) test -short -count=1 ./...

bench: ## measure relayd against this machine's ceilings (local services, 5–10 min): markdown table, bench-results.json
	$(GO) run ./cmd/relayd-bench -version "$(VERSION)" -out bench-results.json

bench-horizon: ## the long-transaction soak: each kind held 10 min at 1,500 rows/s (about 30 min): bench-horizon.json
	$(GO) run ./cmd/relayd-bench -version "$(VERSION)" -only horizon -out bench-horizon.json

lint: ## gofmt, go.mod tidy, go vet and staticcheck
	@unformatted="$$(gofmt -l .)"; if [ -n "$$unformatted" ]; then echo "gofmt -l: these files are not formatted (run gofmt -w):"; echo "$$unformatted"; exit 1; fi
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

up: ## start Postgres, RabbitMQ, NATS and relayd with docker compose
	VERSION="$(VERSION)" docker compose up -d --build

down: ## stop the compose services
	docker compose down -v

clean: ## remove build output
	rm -rf bin

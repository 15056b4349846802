# fencekeeper — fenced distributed locks for Kubernetes.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

IMG ?= fencekeeper/manager:latest
CONTROLLER_GEN := go tool controller-gen
KUBEBUILDER_ASSETS ?= $(CURDIR)/bin/k8s
export KUBEBUILDER_ASSETS
GO_TEST_FLAGS ?=

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: ## Generate CRDs, RBAC and webhook manifests from the Go markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd webhook paths="./..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: fmt
fmt: ## go fmt
	go fmt ./...

.PHONY: vet
vet: ## go vet
	go vet ./...

.PHONY: control-plane
control-plane: ## Build etcd and kube-apiserver into bin/k8s (no-op when present).
	hack/build-control-plane.sh

.PHONY: verify-generated
verify-generated: manifests generate ## Fail if generated files are out of date.
	@git diff --quiet -- config api || { git --no-pager diff --stat -- config api; echo "generated files are stale: run make manifests generate and commit"; exit 1; }

.PHONY: test
test: control-plane manifests generate vet ## Run every test: pure packages with -race, then the envtest suites.
	go test -race -count=1 $(GO_TEST_FLAGS) $$(go list ./... | grep -v /test/)
	go test -v -count=1 -timeout 30m $(GO_TEST_FLAGS) ./test/...

##@ Build

.PHONY: build
build: manifests generate fmt vet ## Build the manager binary.
	go build -o bin/manager ./cmd/manager

.PHONY: run
run: manifests generate ## Run the manager against the current kubeconfig.
	go run ./cmd/manager --leader-elect=false

.PHONY: docker-build
docker-build: ## Build the manager image.
	docker build -t $(IMG) .

##@ Deployment

.PHONY: install
install: manifests ## Install the CRDs into the current cluster.
	kubectl apply -k config/crd

.PHONY: uninstall
uninstall: manifests ## Remove the CRDs from the current cluster.
	kubectl delete -k config/crd --ignore-not-found

.PHONY: deploy
deploy: manifests ## Deploy the operator (needs cert-manager) to the current cluster.
	kubectl apply -k config/default

.PHONY: undeploy
undeploy: ## Remove the operator from the current cluster.
	kubectl delete -k config/default --ignore-not-found

##@ Stories

.PHONY: demo
demo: control-plane ## The stale-owner story end to end on the embedded control plane (exits 0 only if every expected verdict happened).
	go run ./cmd/demo

.PHONY: dev
dev: control-plane ## Embedded control plane + operator (self-signed webhook certs); prints the KUBECONFIG to export; Ctrl-C stops everything.
	go build -o bin/kubectl-fence ./cmd/kubectl-fence
	go build -o bin/fencekeeper-dev ./cmd/dev
	bin/fencekeeper-dev

.PHONY: gates
gates: ## Release-gate report: 100,000 seeded schedules of the simulator (SEED=n replays one with its trace; BASE_SEED=n, SCHEDULES=n).
	go run ./test/sim/cmd/gates -schedules=$(or $(SCHEDULES),100000) $(if $(BASE_SEED),-base-seed=$(BASE_SEED)) $(if $(SEED),-seed=$(SEED))

.PHONY: bench
bench: control-plane ## Benchmarks vs raw baselines in one run: handoff, expiry, throughput, webhook overhead, scale; prints a table with PASS/FAIL, writes bin/bench/results.json (BENCH_FLAGS=-quick for a smoke run).
	go run ./test/bench $(BENCH_FLAGS)

# fencekeeper — fenced distributed locks for Kubernetes.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

# The binaries' version: the nearest tag, or the commit, "-dirty" with local changes.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
VERSION_PKG := github.com/fencekeeper/fencekeeper/internal/version
LDFLAGS ?= -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Commit=$(COMMIT)
# The release dist/ describes (one source: the chart's appVersion). The
# default image is that release's; dist/install.yaml is committed for it.
RELEASE ?= $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*$$/\1/p' dist/chart/Chart.yaml)
# The manager image, fully qualified: CRI-O in enforcing short-name mode
# refuses a name without a registry host.
REGISTRY ?= ghcr.io/fencekeeper
IMG ?= $(REGISTRY)/manager:$(RELEASE)
# make release: where the artifacts go, and the time every file in them is
# dated (the commit's, so the same commit builds the same image digest).
RELEASE_DIR ?= dist/release
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
# The platforms to build the image and kubectl-fence for, os/arch,...; empty
# is all. Fewer only checks a release (make test, whose build cache may be
# cold): never publish one.
RELEASE_PLATFORMS ?=
# Helm is built from the module proxy into bin/tools once (not a go.mod dependency).
HELM_VERSION ?= v3.22.0
# (go install does not stamp helm's version: the version is in the file name.)
HELM ?= $(CURDIR)/bin/tools/helm-$(HELM_VERSION)
# helm template checks the chart's kubeVersion against this, not a cluster.
HELM_KUBE_VERSION ?= 1.31.0
# golangci-lint is built the same way (once, outside go.mod; version in the file name).
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT ?= $(CURDIR)/bin/tools/golangci-lint-$(GOLANGCI_LINT_VERSION)
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
	cp config/webhook/manifests.yaml internal/operator/webhooks.yaml  # the operator's own webhook shape (embedded)

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

.PHONY: controller-manager
controller-manager: ## Build kube-controller-manager into bin/k8s (no-op when present): dev, demo, test and chaos run its namespace and garbage-collector controllers.
	hack/build-control-plane.sh kube-controller-manager

# The PostgreSQL server binaries internal/pgserver starts a throwaway server
# from, found as it finds them: $FENCEKEEPER_PG_BINDIR, the highest
# /usr/lib/postgresql/*/bin, pg_config --bindir, then PATH.
.PHONY: postgres
postgres: ## Install the PostgreSQL server binaries (apt-get install postgresql, with sudo unless root) when initdb and postgres are missing; the tests and the demo start their own server from them.
	@has() { [ -n "$$1" ] && [ -x "$$1/initdb" ] && [ -x "$$1/postgres" ]; }; \
	if [ -n "$$FENCEKEEPER_PG_BINDIR" ]; then \
	  has "$$FENCEKEEPER_PG_BINDIR" || { echo "FENCEKEEPER_PG_BINDIR=$$FENCEKEEPER_PG_BINDIR holds no initdb and postgres" >&2; exit 1; }; exit 0; \
	fi; \
	for dir in $$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV) "$$(pg_config --bindir 2>/dev/null)" \
	  "$$(dirname "$$(readlink -f "$$(command -v initdb)" 2>/dev/null)")"; do \
	  if has "$$dir"; then exit 0; fi; \
	done; \
	command -v apt-get >/dev/null || { echo "no PostgreSQL server binaries (initdb, postgres) and no apt-get: install PostgreSQL's server, or set FENCEKEEPER_PG_BINDIR" >&2; exit 1; }; \
	sudo=; [ "$$(id -u)" = 0 ] || sudo=sudo; \
	echo "no PostgreSQL server binaries (initdb, postgres): $${sudo:+sudo }apt-get install -y --no-install-recommends postgresql"; \
	$$sudo apt-get update -qq || echo "apt-get update failed; installing from the package lists as they are"; \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql

.PHONY: api-docs
api-docs: manifests ## Regenerate docs/api-reference.md from the CRDs (go test ./internal/apidocs checks it is current).
	go test ./internal/apidocs -count=1 -run TestReferenceIsCurrent -update

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint: .golangci.yml (layout tiers, vet, staticcheck, errcheck, product complexity ceilings...), then the harness ceilings (.golangci-harness.yml).
	$(GOLANGCI_LINT) run ./...
	$(GOLANGCI_LINT) run -c .golangci-harness.yml ./...

# git status, not git diff: a newly generated file is untracked, not modified.
.PHONY: verify-generated
verify-generated: manifests generate ## Fail if generated files are out of date.
	@test -z "$$(git status --porcelain -- config api)" || { git status --short -- config api; echo "generated files are stale: run make manifests generate and commit"; exit 1; }

.PHONY: test
test: control-plane controller-manager manifests generate vet postgres ## Run every test: pure packages with -race, then the envtest suites.
	go test -race -count=1 $(GO_TEST_FLAGS) $$(go list ./... | grep -v /test/)
	go test -v -count=1 -timeout 30m $(GO_TEST_FLAGS) $$(go list ./test/... | grep -v -e /test/chaos -e /test/release) # includes test/ha (two manager processes, ~75 s) and test/bench (quick bench, quick soak: ~3 min)
	go test -v -count=1 -timeout 10m $(GO_TEST_FLAGS) ./test/chaos # make chaos cut down: one 30 s schedule, ~75 s; alone, as it loads both cores
	RELEASE_PLATFORMS=linux/amd64 go test -v -count=1 -timeout 45m $(GO_TEST_FLAGS) ./test/release # make release into a temporary directory, for linux/amd64 only (2 builds; make test-release: all 8 cross-compiles); alone, as it loads both cores
	$(MAKE) test-monitoring

.PHONY: test-release
test-release: ## make test's release check for every platform of the image and kubectl-fence (8 cross-compiles; ~20 min on a cold build cache): run it before tagging (docs/releasing.md).
	RELEASE_PLATFORMS= go test -v -count=1 -timeout 60m $(GO_TEST_FLAGS) ./test/release

.PHONY: test-monitoring
test-monitoring: ## Check the alert rules and dashboard with Prometheus's parsers (a module of its own: test/monitoring).
	cd test/monitoring && go test -count=1 $(GO_TEST_FLAGS) ./...

##@ Build

.PHONY: build
build: manifests generate fmt vet ## Build the manager and kubectl-fence, version-stamped (LDFLAGS).
	go build -ldflags "$(LDFLAGS)" -o bin/manager ./cmd/manager
	go build -ldflags "$(LDFLAGS)" -o bin/kubectl-fence ./cmd/kubectl-fence

.PHONY: run
run: manifests generate ## Run the manager against the current kubeconfig.
	go run ./cmd/manager --leader-elect=false

.PHONY: docker-build
docker-build: ## Build the manager image.
	docker build --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMG) .

# The roles the chart takes from config/rbac as they are (it writes its own bindings).
CHART_RBAC_FILES := role.yaml leader_election_role.yaml lockgrant_requester_role.yaml fencedresource_admin_role.yaml protected_kinds_role.yaml metrics_reader_role.yaml

# render-install prints config/default with the manager image set to IMG
# (internal/release.RenderInstall, which make release uses too). It works on
# a copy of config/: nothing tracked is edited.
define render-install
go run ./hack/release -render-install -image "$(IMG)"
endef

.PHONY: build-installer
# The chart's CRDs are files/crds, not crds/: templates/crds.yaml renders them
# (crds.enabled, crds.keep) so that helm upgrade upgrades them.
build-installer: manifests ## Write dist/install.yaml for IMG and copy the generated CRDs, RBAC, webhooks and alerts into dist/chart.
	@mkdir -p dist/chart/files/crds dist/chart/files/rbac
	@{ echo "# fencekeeper $(RELEASE) for image $(IMG): generated by make build-installer from config/default; do not edit."; \
	  echo "# kubectl apply --server-side -f install.yaml (needs cert-manager; see docs/install.md)"; \
	  $(render-install); } > dist/install.yaml
	rm -f dist/chart/files/crds/*.yaml dist/chart/files/rbac/*.yaml
	cp config/crd/bases/*.yaml dist/chart/files/crds/
	cp $(addprefix config/rbac/,$(CHART_RBAC_FILES)) dist/chart/files/rbac/
	cp config/webhook/manifests.yaml dist/chart/files/webhooks.yaml
	cp config/prometheus/rules.yaml dist/chart/files/prometheus-rules.yaml
	cp config/grafana/fencekeeper.json dist/chart/files/grafana-dashboard.json
	@echo "wrote dist/install.yaml (image $(IMG)) and synced dist/chart"

$(HELM):
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && GOBIN=$$tmp go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) && \
	mkdir -p $(dir $(HELM)) && mv $$tmp/helm $(HELM)

$(GOLANGCI_LINT):
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	GOBIN=$$tmp go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) && \
	mkdir -p $(dir $(GOLANGCI_LINT)) && mv $$tmp/golangci-lint $(GOLANGCI_LINT)

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT) ## Build golangci-lint $(GOLANGCI_LINT_VERSION) into bin/tools (once).

.PHONY: helm
helm: $(HELM) ## Build helm $(HELM_VERSION) into bin/tools (once).

.PHONY: helm-template
helm-template: $(HELM) ## Render dist/chart with its default values.
	$(HELM) template fencekeeper dist/chart --kube-version $(HELM_KUBE_VERSION)

.PHONY: helm-lint
helm-lint: $(HELM) ## helm lint --strict dist/chart (values.schema.json included; test/install runs it too).
	$(HELM) lint --strict dist/chart --kube-version $(HELM_KUBE_VERSION)

##@ Release

.PHONY: release
release: release-version $(HELM) ## Build everything a release publishes into RELEASE_DIR (dist/release) without a container daemon: VERSION=vX.Y.Z (docs/releasing.md).
	rm -rf $(RELEASE_DIR)
	go run ./hack/release -version "$(VERSION)" -commit "$(COMMIT)" -ldflags "$(LDFLAGS)" -image "$(IMG)" \
	  -out "$(RELEASE_DIR)" -helm "$(HELM)" -source-date-epoch "$(SOURCE_DATE_EPOCH)" \
	  -platforms "$(RELEASE_PLATFORMS)"

# VERSION has a default (git describe) for make build; a release names its tag.
.PHONY: release-version
release-version:
	@case "$(origin VERSION)" in "command line"|environment*) ;; \
	  *) echo 'make release needs the release tag: make release VERSION=v0.1.0 (docs/releasing.md)' >&2; exit 1;; esac

##@ Deployment

.PHONY: install
install: manifests ## Install the CRDs into the current cluster.
	kubectl apply -k config/crd

.PHONY: uninstall
uninstall: manifests ## Remove the CRDs from the current cluster.
	kubectl delete -k config/crd --ignore-not-found

.PHONY: deploy
deploy: manifests ## Deploy the operator with image IMG (needs cert-manager) to the current cluster.
	@$(render-install) | kubectl apply --server-side -f -

.PHONY: undeploy
undeploy: ## Remove the operator (delete FencedResources and LockGrants first: docs/install.md).
	kubectl delete -k config/default --ignore-not-found

##@ Stories

.PHONY: demo
demo: control-plane controller-manager postgres ## The stale-owner story end to end on the embedded control plane (exits 0 only if every expected verdict happened).
	go run ./cmd/demo

.PHONY: dev
dev: control-plane controller-manager ## Embedded control plane + operator (self-signed webhook certs); prints the KUBECONFIG to export; Ctrl-C stops everything (PROTECTED_KINDS=widgets.example.com/v1,…: custom kinds to protect; BARE=1: an empty cluster to install into).
	go build -o bin/kubectl-fence ./cmd/kubectl-fence
	go build -o bin/fencekeeper-dev ./cmd/dev
	bin/fencekeeper-dev $(if $(BARE),-bare) $(if $(PROTECTED_KINDS),-protected-kinds=$(PROTECTED_KINDS))

.PHONY: gates
gates: ## Release-gate report: 100,000 seeded schedules of the simulator (SEED=n replays one with its trace; BASE_SEED=n, SCHEDULES=n).
	go run ./test/sim/cmd/gates -schedules=$(or $(SCHEDULES),100000) $(if $(BASE_SEED),-base-seed=$(BASE_SEED)) $(if $(SEED),-seed=$(SEED))

.PHONY: chaos
chaos: control-plane controller-manager ## Fault schedules on a replicated control plane (3 etcd, 2 apiservers, 2 operators, own netns each; needs root): SEED=n replays one, CHAOS_SCHEDULES=n runs more, BROKEN=cached-registry-read or unprotected-store-table.
	go run ./test/chaos/cmd/chaos -schedules=$(or $(CHAOS_SCHEDULES),$(if $(SEED),1,6)) $(if $(SEED),-seed=$(SEED)) $(if $(BROKEN),-broken=$(BROKEN))

# The PostgreSQL store's part runs as a test of test/bench (TestPGStoreBench;
# make test runs it quick): its own durable server, fenced segments against
# plain transactions.
.PHONY: bench
bench: control-plane postgres ## Benchmarks against floors measured in the same run: handoff, expiry, throughput, webhook overhead, scale; prints a table with PASS/FAIL/INCONCLUSIVE, writes bin/bench/results.json and SVG plots; then the PostgreSQL store vs plain transactions, bin/bench/pgstore.json (BENCH_FLAGS=-quick for a smoke run).
	go run ./test/bench $(BENCH_FLAGS)
	go test ./test/bench -count=1 -v -timeout 20m -run '^TestPGStoreBench$$' -args \
	  $(if $(filter -quick,$(BENCH_FLAGS)),,-pgstore.full) $(if $(filter -fail-on-miss,$(BENCH_FLAGS)),-pgstore.fail-on-miss)

.PHONY: bench-scale
bench-scale: control-plane ## 100,000 FencedResources (10,000 held) against 1,000 in the same run, then the leader killed: memory per replica (each a 512 MiB container: --memory-limit), handoff and protected-write p99 growth, takeover to first grant and to every waiter served; bin/bench/scale.json (about 40 min; BENCH_SCALE_FLAGS for more).
	go run ./test/bench -only scale -scale 1000,100000 -scale-held 10000 -failover -scale-rss-limit 512 \
	  -operator-memory-limit $$((512 << 20)) -loaders 16 -out bin/bench/scale.json $(BENCH_SCALE_FLAGS)

.PHONY: soak
soak: control-plane ## Hostile-tenant soak: honest workers beside a tenant attacking for SOAK_DURATION (default 5m) in windows between quiet ones; PASS/FAIL/INCONCLUSIVE per check, bin/bench/soak.json, exit 2 on FAIL (~25 min with the claim collector's wait; SOAK_FLAGS for more).
	go run ./test/bench -only soak -soak-duration=$(or $(SOAK_DURATION),5m) -out bin/bench/soak.json -fail-on-miss $(SOAK_FLAGS)

# Build the manager.
FROM golang:1.26 AS builder
ARG TARGETOS
ARG TARGETARCH
# make docker-build passes the version and commit stamped into the binary.
ARG VERSION=devel
ARG COMMIT=unknown
WORKDIR /workspace
COPY go.mod go.sum ./
RUN go mod download
COPY cmd/ cmd/
COPY api/ api/
COPY controllers/ controllers/
COPY webhooks/ webhooks/
COPY pkg/ pkg/
COPY internal/ internal/
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} go build -trimpath \
    -ldflags "-s -w -X github.com/fencekeeper/fencekeeper/internal/version.Version=${VERSION} -X github.com/fencekeeper/fencekeeper/internal/version.Commit=${COMMIT}" \
    -o manager ./cmd/manager

# A static, non-root runtime image.
FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /workspace/manager .
USER 65532:65532
ENTRYPOINT ["/manager"]

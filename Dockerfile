# The manager image for local use (make docker-build). Releases do not use
# this file: make release assembles the published multi-arch image without a
# container daemon (internal/release, docs/releasing.md). Both images hold
# the same files and run the manager the same way (internal/release's tests
# check the USER and ENTRYPOINT lines below).
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
RUN CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} go build -trimpath -buildvcs=false \
    -ldflags "-s -w -X github.com/fencekeeper/fencekeeper/internal/version.Version=${VERSION} -X github.com/fencekeeper/fencekeeper/internal/version.Commit=${COMMIT}" \
    -o manager ./cmd/manager
# The release image's file system besides the binary: a nonroot user
# (65532) for tools that show names, and /tmp for the webhook certificate
# mount. No CA certificates: in a cluster the manager talks only to the API
# server, verified with the service account's ca.crt.
RUN mkdir -p rootfs/etc rootfs/home/nonroot rootfs/tmp && chmod 1777 rootfs/tmp && \
    chown 65532:65532 rootfs/home/nonroot && chmod 700 rootfs/home/nonroot && \
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > rootfs/etc/passwd && \
    printf 'root:x:0:\nnonroot:x:65532:\n' > rootfs/etc/group && \
    cp manager rootfs/manager

# A static, non-root runtime image on nothing.
FROM scratch
ARG VERSION=devel
ARG COMMIT=unknown
LABEL org.opencontainers.image.title="fencekeeper-manager" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.source="https://github.com/fencekeeper/fencekeeper" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /workspace/rootfs/ /
WORKDIR /
USER 65532:65532
ENTRYPOINT ["/manager"]

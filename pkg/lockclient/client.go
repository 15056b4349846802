package lockclient

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// Client acquires locks in one namespace as one identity.
type Client struct {
	kube      client.WithWatch
	namespace string
	identity  string
	// pod is the UID of the pod the API server authenticates kube as coming
	// from ("" for none): this client's requests are bound to it.
	pod      string
	registry registryFeeds // the FencedResource watches its Acquire calls share
}

// New returns a client that acts as identity (the Kubernetes user name the API
// server authenticates kube as; the webhook checks they match) from no pod.
// In a pod, use NewForConfig: a pod's requests must be bound to it.
func New(kube client.WithWatch, namespace, identity string) *Client {
	return &Client{kube: kube, namespace: namespace, identity: identity}
}

// NewForConfig builds a client from a REST config and asks the API server who
// it is (SelfSubjectReview), so the owner is always the authenticated user and,
// when its credentials are a pod's bound service-account token, the pod every
// request is bound to (spec.lease "pod:<UID>"): another replica sharing the
// ServiceAccount can then never use this client's grants, nor this one theirs.
func NewForConfig(ctx context.Context, cfg *rest.Config, namespace string) (*Client, error) {
	kube, err := client.NewWithWatch(cfg, client.Options{Scheme: locksv1.Scheme})
	if err != nil {
		return nil, err
	}
	review := &authenticationv1.SelfSubjectReview{}
	if err := kube.Create(ctx, review); err != nil {
		return nil, fmt.Errorf("ask the API server who we are (SelfSubjectReview): %w", err)
	}
	c := New(kube, namespace, review.Status.UserInfo.Username)
	c.pod = locksv1.RequestPod(review.Status.UserInfo)
	return c, nil
}

// Identity is the owner this client claims as.
func (c *Client) Identity() string { return c.identity }

// Pod is the UID of the pod this client's requests are bound to ("" for none).
func (c *Client) Pod() string { return c.pod }

// leaseFor is the lease of a request: the client's pod's when it runs in one
// (the LockGrant webhook refuses any other), else the caller's or one derived
// from the requestID.
func (c *Client) leaseFor(o AcquireOptions) (string, error) {
	switch {
	case c.pod != "" && o.Lease != "" && o.Lease != grant.PodLease(c.pod):
		return "", fmt.Errorf("AcquireOptions.Lease %q: this client runs in pod %s, whose requests are bound to it (lease %q); leave Lease empty",
			o.Lease, c.pod, grant.PodLease(c.pod))
	case c.pod != "":
		return grant.PodLease(c.pod), nil
	case o.Lease != "":
		return o.Lease, nil
	}
	return "lease-" + o.RequestID, nil
}

// LockGrantName is the name of the LockGrant in which this client requests
// resource with requestID (locksv1.LockGrantName with its identity as owner):
// Acquire creates it, and finds it again after a lost response.
func (c *Client) LockGrantName(resource, requestID string) string {
	return locksv1.LockGrantName(resource, c.identity, requestID)
}

// NewRequestID returns a random request ID. Persist it before acquiring if a
// restarted worker must find its request again.
func NewRequestID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// OperationRoot returns sha256:<hex> of a description of the planned operation.
func OperationRoot(plan string) string {
	sum := sha256.Sum256([]byte(plan))
	return "sha256:" + hex.EncodeToString(sum[:])
}

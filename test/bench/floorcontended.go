package main

import (
	"context"
	"fmt"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
)

// The contended floor: the contract's contended cycle with nothing else.
// Several clients share one floor registry object and its minimal issuer
// (floorhandoff.go); a client's cycle is
//
//	create its LockGrant (through the floor's create webhook)
//	→ its registry watch shows it holding
//	→ release PATCH → the issuer's one CAS ends it and issues the next
//	→ its registry watch shows the end
//
// three custom-resource writes a cycle once every client waits: the request,
// the release and the CAS.

// floorFollower follows one floor registry object: the holder it last
// showed, and a channel closed at every change.
type floorFollower struct {
	mu      sync.Mutex
	holder  string
	changed chan struct{}
	err     error
}

func followFloorRegistry(ctx context.Context, dyn dynamic.Interface, ns, name string) (*floorFollower, error) {
	w, err := dyn.Resource(floorFR).Namespace(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return nil, err
	}
	f := &floorFollower{changed: make(chan struct{})}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			fr, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			holder, _, _ := unstructured.NestedString(fr.Object, "status", "holder", "grantName")
			f.mu.Lock()
			f.holder = holder
			close(f.changed)
			f.changed = make(chan struct{})
			f.mu.Unlock()
		}
		f.mu.Lock()
		f.err = fmt.Errorf("floor registry watch of %s ended", name)
		close(f.changed)
		f.mu.Unlock()
	}()
	return f, nil
}

// await returns once the registry shows a holder for which ok is true, or
// the issuer iss stopped.
func (f *floorFollower) await(ctx context.Context, iss *floorIssuer, ok func(holder string) bool) error {
	for {
		f.mu.Lock()
		holder, changed, err := f.holder, f.changed, f.err
		f.mu.Unlock()
		if ok(holder) {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-changed:
		case <-iss.dead:
			_, err := iss.resourceVersion()
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// floorContender is one client of the contended floor.
type floorContender struct {
	dyn           dynamic.Interface
	ns, resource  string
	owner, prefix string
	follow        *floorFollower
	iss           *floorIssuer
	n             int
}

func (c *floorContender) cycle(ctx context.Context) error {
	c.n++
	name := fmt.Sprintf("%s-%d", c.prefix, c.n)
	if _, err := createFloorGrant(ctx, c.dyn, c.ns, c.resource, name, c.owner); err != nil {
		return err
	}
	if err := c.follow.await(ctx, c.iss, func(h string) bool { return h == name }); err != nil {
		return err
	}
	if err := releaseFloorGrant(ctx, c.dyn, c.ns, name); err != nil {
		return err
	}
	return c.follow.await(ctx, c.iss, func(h string) bool { return h != name })
}

// contendedFloor starts a floor issuer on each of resources registry
// objects (named prefix-0…) and returns clients cyclers, spread over them
// as fencekeeper's contended clients are; with phases, a status merge patch,
// each issuer also writes its ended LockGrants' status phase
// (floorphase.go).
func (e *env) contendedFloor(ctx context.Context, ns, prefix, template string, clients, resources int, phases []byte, count *countingTransport) ([]cycler, error) {
	tmpl, err := e.floorTemplateOf(ctx, ns, template)
	if err != nil {
		return nil, err
	}
	issuers := make([]*floorIssuer, resources)
	for r := 0; r < resources; r++ {
		dyn, _, err := e.floorClient(&countingTransport{}) // the issuer's writes are not the clients'
		if err != nil {
			return nil, err
		}
		writer, err := e.floorPhaseWriter(ctx, ns, phases)
		if err != nil {
			return nil, err
		}
		if issuers[r], err = startFloorIssuer(ctx, dyn, ns, fmt.Sprintf("%s-%d", prefix, r), tmpl, false, writer); err != nil {
			return nil, err
		}
	}
	var out []cycler
	for c := 0; c < clients; c++ {
		dyn, owner, err := e.floorClient(count)
		if err != nil {
			return nil, err
		}
		resource := fmt.Sprintf("%s-%d", prefix, c%resources)
		follow, err := followFloorRegistry(ctx, dyn, ns, resource)
		if err != nil {
			return nil, err
		}
		fc := &floorContender{dyn: dyn, ns: ns, resource: resource, owner: owner, prefix: fmt.Sprintf("%s-c%d", resource, c), follow: follow, iss: issuers[c%resources]}
		out = append(out, fc.cycle)
	}
	return out, nil
}

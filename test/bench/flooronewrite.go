package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// The one-write handoff floor (docs/one-write-handoff.md): what a handoff
// would cost if the issuer signed the queue head's grant while the holder
// still holds, and the holder's release itself promoted it:
//
//	holder: one CAS of the registry status (through a webhook that would
//	check it is the holder promoting the pre-signed head): holder := the
//	head's signed record, its own grant recorded as ended
//	→ watch hop to the waiter, which follows the registry.
//
// One custom-resource write and one hop, like the raw Lease handoff, on
// objects of fencekeeper's size. The signing happens before the release and
// is not timed: the design moves it off the handoff.

// oneWriteLabel marks the floor registry objects whose status writes go
// through the floor's promotion webhook.
const oneWriteLabel = "bench.fencekeeper.dev/one-write"

// oneWriteHandoffs measures the one-write floor on a registry object whose
// status copies template's (a real one, after fencekeeper's handoffs).
func (e *env) oneWriteHandoffs(ctx context.Context, ns, resource, template string, warmup, n int) ([]time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tmpl, err := e.floorTemplateOf(ctx, ns, template)
	if err != nil {
		return nil, err
	}
	if err := e.observeFloor(ctx, ns); err != nil {
		return nil, err
	}
	var ws [2]floorWorker
	for i := range ws {
		dyn, owner, err := e.floorClient(&countingTransport{})
		if err != nil {
			return nil, err
		}
		ws[i] = floorWorker{dyn: dyn, owner: owner}
	}
	fr, st, err := createFloorRegistry(ctx, ws[0].dyn, ns, resource, tmpl)
	if err != nil {
		return nil, err
	}
	if fr, err = ws[0].dyn.Resource(floorFR).Namespace(ns).Patch(ctx, resource, types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, oneWriteLabel)), metav1.PatchOptions{}); err != nil {
		return nil, err
	}
	signer, err := grant.GenerateSigner(rand.Reader)
	if err != nil {
		return nil, err
	}
	head := func(i int) (*locksv1.Holder, error) { // the issuer's pre-signed record for request i
		now := time.Now().UTC()
		name := fmt.Sprintf("%s-%d", resource, i)
		h := &locksv1.Holder{GrantName: name, GrantUID: fmt.Sprintf("00000000-0000-0000-0000-%012d", i), Owner: ws[i%2].owner,
			Lease: "lease-" + name, RequestID: name, FenceToken: st.FenceToken + 1, OperationRoot: floorOperationRoot,
			IssuerEpoch: st.IssuerEpoch, PolicyGeneration: tmpl.Generation, BackendRevision: fr.GetResourceVersion(),
			TTLSeconds: int64(tmpl.Spec.LeaseDurationSeconds), IssuedAt: now.Format(time.RFC3339Nano), ExpiresAt: metav1.NewMicroTime(now.Add(time.Minute))}
		h.Digest, h.Proof, err = signer.Sign(h.Grant(ns + "/" + resource))
		return h, err
	}
	var out []time.Duration
	for i := 0; i <= warmup+n; i++ {
		next, err := head(i)
		if err != nil {
			return nil, err
		}
		watching := make(chan struct{})
		type seen struct {
			at  time.Time
			err error
		}
		ch := make(chan seen, 1)
		rv := fr.GetResourceVersion()
		go func() {
			_, at, err := ws[i%2].waitHolder(ctx, ns, resource, next.GrantName, rv, watching)
			ch <- seen{at, err}
		}()
		<-watching
		t0 := time.Now()
		if st.Holder != nil {
			recordFloorRelease(st, st.Holder.GrantUID)
		}
		st.FenceToken, st.Holder = next.FenceToken, next
		// The promotion is the previous holder's write (worker (i+1)%2).
		if fr, err = writeFloorStatus(ctx, ws[(i+1)%2].dyn, fr, st); err != nil {
			return nil, fmt.Errorf("one-write promotion %d: %w", i, err)
		}
		var s seen
		select {
		case s = <-ch:
		case <-time.After(30 * time.Second):
			return nil, fmt.Errorf("one-write handoff %d: the waiter did not see the promotion within 30s", i)
		}
		if s.err != nil {
			return nil, s.err
		}
		if i > warmup {
			out = append(out, s.at.Sub(t0))
		}
	}
	return out, nil
}

package localcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/operator"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

// Operator is an operator running in this process against the control plane.
type Operator struct {
	cancel  context.CancelFunc
	done    chan error
	certDir string
}

// RunOperator installs the webhook configuration and runs the operator as its
// RBAC-limited user, exactly as cmd/manager runs it with --self-signed-certs:
// leader election on, a self-generated serving certificate, the caBundle
// patched in by the operator. It returns once the operator issues grants and
// the API server trusts its webhooks.
func (cp *ControlPlane) RunOperator(ctx context.Context, o operator.Options) (*Operator, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	if err := cp.InstallWebhooks(ctx, "127.0.0.1", port); err != nil {
		return nil, err
	}
	certDir, err := os.MkdirTemp("", "fencekeeper-webhook-certs-")
	if err != nil {
		return nil, err
	}
	o.Namespace = locksv1.DefaultNamespace
	o.WebhookHost, o.WebhookPort, o.CertDir = "127.0.0.1", port, certDir
	o.SelfSignedCerts, o.WebhookHosts, o.WebhookConfiguration = true, []string{"127.0.0.1", "localhost"}, locksv1.WebhookConfigurationName
	o.LeaderElect = true
	if o.ProtectedKinds == nil {
		// The kinds this control plane's webhook configuration was installed with.
		o.ProtectedKinds = cp.opts.ProtectedKinds
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = "0"
	}
	if o.ProbeAddr == "" {
		o.ProbeAddr = "0"
	}
	issuing := make(chan struct{})
	o.OnIssuing = func() { close(issuing) }
	runCtx, cancel := context.WithCancel(ctx)
	op := &Operator{cancel: cancel, done: make(chan error, 1), certDir: certDir}
	go func() { op.done <- operator.Run(runCtx, cp.Operator, o) }()
	fail := func(err error) (*Operator, error) {
		_ = op.Stop()
		return nil, err
	}
	select {
	case <-issuing:
	case err := <-op.done:
		op.done <- err
		return fail(fmt.Errorf("operator stopped before it was ready: %w", err))
	case <-time.After(60 * time.Second):
		return fail(errors.New("operator not ready after 60s"))
	}
	if err := cp.WaitForWebhooks(ctx); err != nil {
		return fail(err)
	}
	return op, nil
}

// Stop stops the operator (it releases its leader lease) and waits for it.
func (op *Operator) Stop() error {
	op.cancel()
	err := <-op.done
	op.done <- err
	_ = os.RemoveAll(op.certDir)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// WaitForWebhooks returns once an operator running with self-signed
// certificates (in this process or as cmd/manager) has patched the webhook
// configuration's caBundle and the API server reaches its webhooks.
func (cp *ControlPlane) WaitForWebhooks(ctx context.Context) error {
	if err := cp.waitCABundle(ctx); err != nil {
		return err
	}
	return cp.warmUpWebhooks(ctx)
}

// waitCABundle waits until every webhook of the configuration carries a caBundle.
func (cp *ControlPlane) waitCABundle(ctx context.Context) error {
	admin, err := cp.AdminClient()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var cfg admissionregistrationv1.ValidatingWebhookConfiguration
		if err := admin.Get(ctx, client.ObjectKey{Name: locksv1.WebhookConfigurationName}, &cfg); err != nil {
			return err
		}
		patched := len(cfg.Webhooks) > 0
		for _, w := range cfg.Webhooks {
			patched = patched && len(w.ClientConfig.CABundle) > 0
		}
		if patched {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the operator did not patch the webhook caBundle within 60s")
		}
		if err := ctxtime.Sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// warmUpWebhooks makes one dry-run call through the FencedResource webhook:
// it returns once the API server has loaded the patched caBundle and reaches
// the operator, so the first real request does not wait for that.
func (cp *ControlPlane) warmUpWebhooks(ctx context.Context) error {
	admin, err := cp.AdminClient()
	if err != nil {
		return err
	}
	probe := &locksv1.FencedResource{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "webhook-warm-up"},
		Spec:       locksv1.FencedResourceSpec{ResourceID: "fencekeeper/webhook-warm-up", LeaseDurationSeconds: 1},
	}
	var last error
	for i := 0; i < 50; i++ {
		if last = admin.Create(ctx, probe.DeepCopy(), client.DryRunAll); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the API server cannot reach the operator's webhooks: %w", last)
}

// FreePort is a TCP port on 127.0.0.1 that was free a moment ago, for a
// process the caller starts next.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

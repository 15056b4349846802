package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
)

// floorWebhook is the floor's webhook: the contract admits a LockGrant only
// through a validating webhook, so the floor pays the API server's call to
// one (TLS, the AdmissionReview both ways) and the decoding of the object,
// and allows it. What fencekeeper's own webhook decides beyond that is the
// operator's share, above the floor. It also sees the one-write handoff's
// promotion (oneWriteHandoffs).
type floorWebhook struct {
	calls atomic.Int64
}

const floorWebhookName = "bench-floor-create.floor.bench.fencekeeper.dev"

// installFloorWebhook serves the floor's create webhook from this process
// and registers it for CREATE of the floor group's LockGrants; it returns
// once the API server calls it.
func (e *env) installFloorWebhook(ctx context.Context, dyn dynamic.Interface, ns string) error {
	cert, caPEM, err := selfSignedLoopback()
	if err != nil {
		return err
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return err
	}
	w := &floorWebhook{}
	srv := &http.Server{Handler: http.HandlerFunc(w.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	url := fmt.Sprintf("https://%s/validate", ln.Addr().String())
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	timeout := int32(10)
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-floor-create"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    floorWebhookName,
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, Rule: admissionregistrationv1.Rule{APIGroups: []string{floorGroup}, APIVersions: []string{"*"}, Resources: []string{"lockgrants"}}}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}, {
			// The one-write handoff's promotion (oneWriteHandoffs): a
			// client's write of the registry, which a webhook would have
			// to check came from the holder and promotes the pre-signed head.
			Name:                    "bench-floor-promote.floor.bench.fencekeeper.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules:                   []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update}, Rule: admissionregistrationv1.Rule{APIGroups: []string{floorGroup}, APIVersions: []string{"*"}, Resources: []string{"fencedresources/status"}}}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{oneWriteLabel: "true"}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if err := e.admin.Create(ctx, cfg); err != nil {
		return fmt.Errorf("floor create webhook: %w", err)
	}
	// The API server loads the configuration asynchronously: create probe
	// LockGrants until one reaches the webhook.
	probe := 0
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		before := w.calls.Load()
		probe++
		if _, err := createFloorGrant(ctx, dyn, ns, "floor-webhook-probe", fmt.Sprintf("floor-webhook-probe-%d", probe), "bench"); err != nil {
			return false, err
		}
		return w.calls.Load() > before, nil
	})
	if err != nil {
		return fmt.Errorf("the API server did not call the floor's create webhook: %w", err)
	}
	return nil
}

// serve answers an AdmissionReview: it decodes the object and allows it.
func (w *floorWebhook) serve(rw http.ResponseWriter, req *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(req.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(rw, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	var obj map[string]any
	allowed, msg := true, ""
	if err := json.Unmarshal(review.Request.Object.Raw, &obj); err != nil {
		allowed, msg = false, err.Error()
	}
	w.calls.Add(1)
	review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: allowed, Result: &metav1.Status{Message: msg}}
	review.Request = nil
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(&review)
}

// selfSignedLoopback is a serving certificate for 127.0.0.1 and its PEM, the
// webhook configuration's caBundle.
func selfSignedLoopback() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "bench floor webhook"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	cert, err := tls.X509KeyPair(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		return tls.Certificate{}, nil, errors.Join(errors.New("floor webhook certificate"), err)
	}
	return cert, certPEM, nil
}

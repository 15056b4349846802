package envtest

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
	fkoperator "github.com/fencekeeper/fencekeeper/internal/operator"
)

// The metrics endpoint as the operator serves it (operator.MetricsOptions),
// run as the operator user with exactly the generated RBAC: the real API
// server authenticates each scrape's token (TokenReview) and authorizes
// get /metrics (SubjectAccessReview).
var _ = Describe("Secure metrics", Ordered, func() {
	var (
		url    string
		cancel context.CancelFunc
		scrape func(token string) (int, string)
	)

	BeforeAll(func() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		addr := l.Addr().String()
		Expect(l.Close()).To(Succeed())
		mgr, err := ctrl.NewManager(opCfg, ctrl.Options{
			Scheme: scheme, Metrics: fkoperator.MetricsOptions(addr, true, ""),
			HealthProbeBindAddress: "0",
		})
		Expect(err).NotTo(HaveOccurred())
		var ctx context.Context
		ctx, cancel = context.WithCancel(suiteCtx)
		go func() {
			defer GinkgoRecover()
			Expect(mgr.Start(ctx)).To(Succeed())
		}()
		url = "https://" + addr + "/metrics"
		// The endpoint's certificate is self-signed: the scraper cannot verify it here.
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		scrape = func(token string) (int, string) {
			req, err := http.NewRequest(http.MethodGet, url, nil)
			Expect(err).NotTo(HaveOccurred())
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := hc.Do(req)
			if err != nil {
				return 0, err.Error()
			}
			defer func() { _ = resp.Body.Close() }()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
		Eventually(func() int { c, _ := scrape(""); return c }, 20*time.Second).ShouldNot(BeZero(), "metrics endpoint %s never answered", url)
	})

	AfterAll(func() {
		if cancel != nil {
			cancel()
		}
	})

	It("refuses a scrape without a token", func() {
		code, body := scrape("")
		Expect(code).To(Equal(http.StatusUnauthorized), body)
	})

	It("refuses a valid token that may not get /metrics, and serves it once bound to metrics-reader", func() {
		ns := newNamespace()
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prometheus"}}
		Expect(admin.Create(suiteCtx, sa)).To(Succeed())
		cs, err := kubernetes.NewForConfig(adminCfg)
		Expect(err).NotTo(HaveOccurred())
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(suiteCtx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		token := tr.Status.Token

		code, body := scrape(token)
		Expect(code).To(Equal(http.StatusForbidden), body)

		root, err := localcp.RepoRoot()
		Expect(err).NotTo(HaveOccurred())
		objs, err := localcp.LoadObjects(scheme, filepath.Join(root, "config", "rbac", "metrics_reader_role.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(objs).To(HaveLen(1))
		role := objs[0].(*rbacv1.ClusterRole)
		role.Name = "metrics-reader-" + ns
		Expect(admin.Create(suiteCtx, role)).To(Succeed())
		Expect(admin.Create(suiteCtx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role.Name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: ns}},
		})).To(Succeed())
		// The filter caches a denial for a while; the binding is seen after it.
		Eventually(func() string {
			code, body := scrape(token)
			return fmt.Sprintf("%d %s", code, firstLine(body))
		}, 2*time.Minute, time.Second).Should(HavePrefix("200 "))
		_, body = scrape(token)
		Expect(body).To(ContainSubstring("fencekeeper_build_info{"))
	})
})

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

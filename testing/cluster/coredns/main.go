// CoreDNS for the real-cluster tests: the cluster's DNS (cluster.local from the API server's
// Services and EndpointSlices), built from upstream's module with only the plugins the test
// cluster's Corefile uses, the way CoreDNS documents an external main selecting its plugins
// (dnsserver.Directives, in plugin.cfg's order). No forward plugin: the cluster's DNS never sends
// a query past itself, and a name outside its zone is REFUSED. Nothing here is shipped.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

func init() {
	dnsserver.Directives = []string{"bind", "errors", "log", "kubernetes"}
}

func main() {
	coremain.Run()
}

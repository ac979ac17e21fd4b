// Command kube runs the control-plane programs of jupyter-vgpu's real cluster, chosen by its
// first argument: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl,
// built from Kubernetes' and etcd's Go modules at the versions go.mod pins. One binary links
// once; the per-node programs (./kubelet, ./fake-cri) are binaries of their own because a
// cluster runs one of each per node, and every program pays in memory for the packages its
// binary initialises.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllers "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

const usage = "usage: kube etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl [flags]"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	program, args := os.Args[1], os.Args[2:]
	switch program {
	case "etcd":
		etcdmain.Main(append([]string{"etcd"}, args...))
	case "kube-apiserver":
		run(apiserver.NewAPIServerCommand(), args)
	case "kube-controller-manager":
		run(controllers.NewControllerManagerCommand(), args)
	case "kube-scheduler":
		run(scheduler.NewSchedulerCommand(), args)
	case "kubectl":
		run(kubectl.NewDefaultKubectlCommand(), args)
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
}

func run(command *cobra.Command, args []string) {
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}

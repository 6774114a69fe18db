#include "broker/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpulet::broker {
namespace {

using ::testing::HasSubstr;

const char* kGood = R"(slurm:
  nodes: [gpua, gpub]
  minNodes: 1
  idleTime: 90s
  reservationLookahead: 2h
kubernetes:
  namespaces: [inference, serving]
  maxNodes: 2
  poolLabel: pool=inference
  taint: pool=slurm:NoSchedule
rules:
  demandEvaluations: 4
  minResidence: 15m
  cooldown: 500ms
  returnAfterIdle: 1d
  evictionTimeout: 10m
  interval: 30
journal: /tmp/j.json
lease: {name: gpulet-broker}
metrics: {address: "127.0.0.1:0"}
)";

TEST(BrokerConfig, ParsesEveryField) {
  Result<BrokerConfig> c = ParseBrokerConfig(kGood, "b.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->nodes, (std::vector<std::string>{"gpua", "gpub"}));
  EXPECT_EQ(c->slurm_min_nodes, 1);
  EXPECT_EQ(c->idle_time, 90'000);
  EXPECT_EQ(c->reservation_lookahead, 7'200'000);
  EXPECT_EQ(c->namespaces, (std::vector<std::string>{"inference", "serving"}));
  EXPECT_EQ(c->k8s_max_nodes, 2);
  EXPECT_EQ(c->pool_label_key, "pool");
  EXPECT_EQ(c->pool_label_value, "inference");
  EXPECT_EQ(c->taint_key, "pool");
  EXPECT_EQ(c->taint_value, "slurm");
  EXPECT_EQ(c->taint_effect, "NoSchedule");
  EXPECT_EQ(c->demand_evaluations, 4);
  EXPECT_EQ(c->cooldown, 500);
  EXPECT_EQ(c->return_after_idle, 86'400'000);
  EXPECT_EQ(c->interval, 30'000);
  EXPECT_EQ(c->journal_path, "/tmp/j.json");
  EXPECT_EQ(c->lease_name, "gpulet-broker");
  EXPECT_EQ(c->lease_namespace, "gpulet-system");
  EXPECT_EQ(c->metrics_address, "127.0.0.1:0");
  EXPECT_TRUE(c->Manages("gpub"));
  EXPECT_FALSE(c->Manages("gpuc"));
}

struct BadCase {
  std::string from, to, expect;
};

class BrokerConfigErrors : public ::testing::TestWithParam<BadCase> {};

TEST_P(BrokerConfigErrors, NameFileLineAndField) {
  std::string text = kGood;
  const size_t at = text.find(GetParam().from);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, GetParam().from.size(), GetParam().to);
  Result<BrokerConfig> c = ParseBrokerConfig(text, "b.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kInvalidInput);
  EXPECT_THAT(c.status().message(), HasSubstr(GetParam().expect));
}

INSTANTIATE_TEST_SUITE_P(
    All, BrokerConfigErrors,
    ::testing::Values(
        BadCase{"idleTime: 90s", "idleTime: soon", "b.yaml:4: slurm.idleTime: must be a duration"},
        BadCase{"maxNodes: 2", "maxNodes: -1", "b.yaml:8: kubernetes.maxNodes: must be between"},
        BadCase{"maxNodes: 2", "maxNodes: two",
                "b.yaml:8: kubernetes.maxNodes: must be an integer"},
        BadCase{"[gpua, gpub]", "[gpua, gpua]",
                "b.yaml:2: slurm.nodes[1]: \"gpua\" is listed twice"},
        BadCase{"[gpua, gpub]", "[]", "b.yaml:2: slurm.nodes: must name at least one node"},
        BadCase{"minNodes: 1", "minNodes: 3", "b.yaml:3: slurm.minNodes: must not exceed"},
        BadCase{"taint: pool=slurm:NoSchedule", "taint: pool=slurm:Never",
                "b.yaml:10: kubernetes.taint: must be key=value:"},
        BadCase{"poolLabel: pool=inference", "poolLabel: inference",
                "b.yaml:9: kubernetes.poolLabel: must be key=value"},
        BadCase{"  cooldown: 500ms", "  cooldwn: 500ms", "b.yaml:14: rules.cooldwn: unknown field"},
        BadCase{"demandEvaluations: 4", "demandEvaluations: 0",
                "b.yaml:12: rules.demandEvaluations: must be between 1"},
        BadCase{"namespaces: [inference, serving]", "namespaces: inference",
                "b.yaml:7: kubernetes.namespaces: must be a list"},
        BadCase{"lease: {name: gpulet-broker}", "lease: {namespace: x}", "lease.name: required"},
        BadCase{"journal: /tmp/j.json", "journal: [", "b.yaml:"},
        // A lease no longer than two intervals lapses between renewals: replicas would flap.
        BadCase{"lease: {name: gpulet-broker}", "lease: {name: gpulet-broker, duration: 60s}",
                "b.yaml:19: lease.duration: must be more than twice rules.interval (30s), got 1m"},
        BadCase{"lease: {name: gpulet-broker}", "lease: {name: gpulet-broker, duration: 30s}",
                "b.yaml:19: lease.duration: must be more than twice rules.interval"},
        BadCase{"interval: 30", "interval: 30 s",
                "b.yaml:17: rules.interval: must be a duration"}));

TEST(BrokerConfig, MissingSectionsAndFile) {
  Result<BrokerConfig> c = ParseBrokerConfig("kubernetes: {namespaces: [a]}\n", "x.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("x.yaml:1: slurm: required"));
  EXPECT_EQ(LoadBrokerConfig("/nonexistent/broker.yaml").status().code(), ErrorCode::kNotFound);
}

// The lease outlives two intervals by default, so the leader renews at least twice before it
// could lapse (it used to default to 30s, equal to the default interval).
TEST(BrokerConfig, DefaultLeaseOutlivesTwoIntervals) {
  Result<BrokerConfig> c = ParseBrokerConfig(kGood, "b.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_GT(c->lease_duration, 2 * c->interval);
  EXPECT_EQ(c->lease_duration, 3 * c->interval);
  BrokerConfig defaults;
  EXPECT_GT(defaults.lease_duration, 2 * defaults.interval);
}

// The one duration grammar (common/duration.h), with bare numbers meaning seconds here.
TEST(BrokerConfig, Durations) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string text = kGood;
    text.replace(text.find(from), from.size(), to);
    return ParseBrokerConfig(text, "b.yaml");
  };
  Result<BrokerConfig> c = with("idleTime: 90s", "idleTime: 45");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->idle_time, 45'000);
  c = with("idleTime: 90s", "idleTime: 1h30m");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->idle_time, 5'400'000);
  c = with("idleTime: 90s", "idleTime: 1.5s");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->idle_time, 1'500);
  for (const char* bad : {"3 m", "m", "-3s", "99999999999999h"}) {
    EXPECT_FALSE(with("idleTime: 90s", std::string("idleTime: ") + bad).ok()) << bad;
  }
}

// Slurm on Kubernetes: the pools replace slurm.nodes.
const char* kScaled = R"(slurm:
  idleTime: 5m
kubernetes:
  namespaces: [inference]
  maxNodes: 2
slurmOnKubernetes:
  namespace: slurm
  pools:
    - statefulSet: slurmd-h100
      replicas: 4
      minReplicas: 1
      gpus: 4
      gpuType: H100
    - {statefulSet: slurmd-l4, replicas: 2, gpus: 2}
)";

TEST(BrokerConfig, ParsesSlurmOnKubernetesPools) {
  Result<BrokerConfig> c = ParseBrokerConfig(kScaled, "b.yaml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->SlurmOnKubernetes());
  EXPECT_TRUE(c->nodes.empty());
  EXPECT_EQ(c->slurm_namespace, "slurm");
  ASSERT_EQ(c->pools.size(), 2u);
  EXPECT_EQ(c->pools[0].stateful_set, "slurmd-h100");
  EXPECT_EQ(c->pools[0].replicas, 4);
  EXPECT_EQ(c->pools[0].min_replicas, 1);
  EXPECT_EQ(c->pools[0].gpus, 4);
  EXPECT_EQ(c->pools[0].gpu_type, "h100");  // Slurm matches gres types case-insensitively
  EXPECT_EQ(c->pools[1].min_replicas, 0);
  EXPECT_EQ(c->pools[1].gpu_type, "");
  int ordinal = 0;
  EXPECT_EQ(c->PoolOf("slurmd-l4-1", &ordinal), &c->pools[1]);
  EXPECT_EQ(ordinal, 1);
  EXPECT_FALSE(ParseBrokerConfig(kGood, "b.yaml")->SlurmOnKubernetes());
}

TEST(BrokerConfig, SlurmOnKubernetesErrorsNameFileLineAndField) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string text = kScaled;
    text.replace(text.find(from), from.size(), to);
    Result<BrokerConfig> c = ParseBrokerConfig(text, "b.yaml");
    return c.ok() ? std::string("ok") : c.status().message();
  };
  EXPECT_EQ(with("  idleTime: 5m", "  nodes: [gpua]"),
            "b.yaml:2: slurm.nodes: not used with slurmOnKubernetes (its pools name the nodes and "
            "their floors)");
  EXPECT_THAT(with("      gpus: 4\n", ""),
              HasSubstr("b.yaml:9: slurmOnKubernetes.pools[0].gpus: required"));
  EXPECT_THAT(with("minReplicas: 1", "minReplicas: 5"),
              HasSubstr("b.yaml:11: slurmOnKubernetes.pools[0].minReplicas: must not exceed "
                        "replicas (4)"));
  EXPECT_THAT(with("replicas: 4", "replicas: 0"),
              HasSubstr("b.yaml:10: slurmOnKubernetes.pools[0].replicas: must be between 1"));
  EXPECT_THAT(with("statefulSet: slurmd-h100", "statefulSet: Slurmd_H100"),
              HasSubstr("b.yaml:9: slurmOnKubernetes.pools[0].statefulSet: must be a StatefulSet "
                        "name"));
  EXPECT_THAT(with("statefulSet: slurmd-l4", "statefulSet: slurmd-h100"),
              HasSubstr("b.yaml:14: slurmOnKubernetes.pools[1].statefulSet: \"slurmd-h100\" is "
                        "listed twice"));
  EXPECT_THAT(with("statefulSet: slurmd-l4", "statefulSet: slurmd-h100-1"),
              HasSubstr("slurmOnKubernetes.pools: \"slurmd-h100\" and \"slurmd-h100-1\""));
  EXPECT_THAT(with("  namespace: slurm\n", ""),
              HasSubstr("b.yaml:7: slurmOnKubernetes.namespace: required"));
  EXPECT_THAT(with("gpuType: H100", "gpuTyp: H100"),
              HasSubstr("b.yaml:13: slurmOnKubernetes.pools[0].gpuTyp: unknown field"));
  EXPECT_THAT(with("  pools:\n", "  pool:\n"), HasSubstr("slurmOnKubernetes.pool: unknown field"));
}

}  // namespace
}  // namespace gpulet::broker

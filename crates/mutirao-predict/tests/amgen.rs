//! AMGen: the model generated from the Appendix-A.1 flow and the Appendix-A.3 task bodies
//! predicts exactly what the thesis's hand-written Appendix-A.3 model predicts; and the full
//! pipeline (flow + Rust source → model → analytic → evaluate) runs end to end.

use mutirao_predict::amgen::{generate, BatchCost};
use mutirao_predict::analyse::analyse;
use mutirao_predict::analytic::{self, Policy, Selection};
use mutirao_predict::machine::MachineModel;
use mutirao_predict::{pamela, pasl};
use std::collections::HashMap;

const PI: &str = include_str!("../examples/data/pi.pamela");
const MACHINES: &str = include_str!("../examples/data/appendix_b_w.txt");
const A_1: &str = "path = \"PIMonteCarlo\";
B1 = \"DistributeData.class\";
B2 = \"ProcessData.class\";
B3 = \"GatherResults.class\";
%%
T1 = B1(1) << NULL;
T2 = B2(100) << T1;
T3 = B3(1) << T2;
";

/// The `taskrun{}` body of task function `header` in the A.3 text.
fn body(header: &str) -> String {
    let start = PI.find(header).expect("header") + header.len();
    let rest = &PI[start..];
    let open = rest.find("taskrun{").expect("taskrun") + "taskrun{".len();
    let close = rest.find("\n   }\n}").expect("end of taskrun");
    rest[open..close].to_string()
}

fn machines() -> MachineModel {
    let mut text = MACHINES.to_string();
    // A second worker, as fast as itu but with its own index, to exercise shares.
    for l in MACHINES.lines().filter(|l| l.contains("[1]")) {
        text.push_str(&l.replace("[1]", "[2]"));
        text.push('\n');
    }
    text.push_str("W[2]=0.5\n");
    MachineModel::from_appendix_b(&text.parse().expect("machine text"))
}

#[test]
fn generated_pi_model_predicts_like_appendix_a3() {
    let dag = pasl::parse(A_1).unwrap().dag(&HashMap::new()).unwrap();
    let cost = |h: &str| BatchCost {
        taskrun: body(h),
        code_size: 879.0,
        data_in: 64.0,
        data_out: 64.0,
    };
    let costs = [
        cost("DistributeData(COORD,0)={"),
        cost("ProcessData(p,0)={"),
        cost("GatherResults(COORD,0)={"),
    ];
    let text = generate(&dag, &costs).unwrap();
    let generated =
        analytic::compile(&pamela::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}")))
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let thesis = analytic::compile(&pamela::parse(PI).unwrap()).unwrap();
    let mm = machines();
    for pol in [Policy::Worst, Policy::Mean, Policy::Best] {
        for sel in [
            Selection::Fastest(1),
            Selection::Fastest(2),
            Selection::Homogeneous { p: 7, like: 2 },
        ] {
            let a = analytic::evaluate(&generated, &mm, &sel, pol).unwrap();
            let b = analytic::evaluate(&thesis, &mm, &sel, pol).unwrap();
            assert_eq!(a.terms.len(), b.terms.len());
            for (x, y) in a.terms.iter().zip(&b.terms) {
                assert_eq!(x.name, y.name);
                let tol = 1e-12 * y.value.hi.max(1.0);
                assert!(
                    (x.value.lo - y.value.lo).abs() <= tol
                        && (x.value.hi - y.value.hi).abs() <= tol,
                    "{}: {} vs {}",
                    x.name,
                    x.value,
                    y.value
                );
            }
            assert_eq!(a.shares, b.shares);
        }
    }
}

#[test]
fn full_pipeline_from_flow_and_rust_source() {
    let src = "
        fn distribute() { let n: i32 = 100; }
        fn process(limit: i32) -> i32 {
            let mut total: i32 = 0;
            for i in 0..limit { if i % 3 == 0 { total += 1; } }
            total
        }
        fn work() -> i32 { process(1000000) }
        fn gather() { let mut s: i64 = 0; for i in 0..100 { s += 1; } }
    ";
    let fig = "B1=\"a\";B2=\"b\";B3=\"c\";B4=\"d\";\n%%\nT1=B1(1)<<NULL;\nT2=B2(40)<<T1;\nT3=B3(40)<<T1;\nT4=B4(1)<<T2,T3;\n";
    let dag = pasl::parse(fig).unwrap().dag(&HashMap::new()).unwrap();
    assert_eq!(
        dag.series_parallel().unwrap().to_string(),
        "𝔹1; (𝔹2 ‖ 𝔹3); 𝔹4"
    );
    let cost = |f: &str| BatchCost {
        taskrun: analyse(src, f, &[]).unwrap().to_pamela(),
        code_size: 2000.0,
        data_in: 64.0,
        data_out: 64.0,
    };
    let text = generate(
        &dag,
        &[
            cost("distribute"),
            cost("work"),
            cost("work"),
            cost("gather"),
        ],
    )
    .unwrap();
    let c = analytic::compile(&pamela::parse(&text).unwrap()).unwrap();
    let p = analytic::evaluate(&c, &machines(), &Selection::Fastest(2), Policy::Worst).unwrap();
    // Two batches of 40 tasks on W = (1, 0.5): shares 27 and 13 each; worker 1 runs 54 tasks.
    assert_eq!(p.shares[&40], vec![27, 13]);
    let workers = p.terms.iter().find(|t| t.name == "T_comp[p]").unwrap();
    assert_eq!(workers.argmax_worker, Some(1));
    assert!(p.interval.lo > 0.0 && p.interval.lo <= p.interval.hi);
    // The per-task cost is ≈ 1e6 iterations; 54 tasks dominate everything else.
    assert_eq!(p.dominant_max, "T_comp[p]");
}

#[test]
fn mismatched_inputs_are_errors() {
    let dag = pasl::parse(A_1).unwrap().dag(&HashMap::new()).unwrap();
    let one = BatchCost {
        taskrun: "access;".into(),
        code_size: 1.0,
        data_in: 1.0,
        data_out: 1.0,
    };
    let e = generate(&dag, std::slice::from_ref(&one))
        .unwrap_err()
        .to_string();
    assert!(e.contains("3 batches but 1 task costs"), "{e}");
    let mut bad = vec![one.clone(), one.clone(), one];
    bad[1].data_in = -1.0;
    let e = generate(&dag, &bad).unwrap_err().to_string();
    assert!(e.starts_with("batch 2 (T2): input size is -1"), "{e}");
}

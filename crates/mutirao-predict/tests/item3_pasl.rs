//! Digest 001 §7.3 item 3: PASL parses Fig. 3.3, Fig. 4.5 and Appendix A.1 without error, and
//! Fig. 4.5 with c = (1,4,4,1,1,1) reduces to `L = 𝔹1; (𝔹2 ‖ (𝔹3; (𝔹4 ‖ 𝔹5))); 𝔹6`.

use mutirao_predict::pasl::{self, Card, Input};
use std::collections::HashMap;

const FIG_3_3: &str = "//seção de declarações
path=aplicacoes/numerosPrimos
B1=DivideDados.class;
B2=ProcessaDados.class;
B3=ColetaResultados.class;

//seção de ligações
T1=B1(1) «dados.dat;
T2=B2(100) «T1;
T3=B3(1) «T2»resultado.dat;
";

const FIG_4_5: &str = "//seção de declarações
path = \"join.applications.sample.apptest\";
B1 = \"DistribuiDados.class\";
B2 = \"Processa1.class\";
B3 = \"Processa2.class\";
B4 = \"Processa3.class\";
B5 = \"Processa4.class\";
B6 = \"ColetaResultados.class\";
//seção de ligações
T1 = B1(c1) « dados.dat;
T2 = B2(c2) « T1;
T3 = B3(c3) « T1;
T4 = B4(c4) « T3;
T5 = B5(c5) « T3;
T6 = B6(c6) « T2,T4,T5 »resultado.dat;
";

const A_1: &str = "// secao de declaracoes
path = \"PIMonteCarlo\";
B1 = \"DistributeData.class\";
B2 = \"ProcessData.class\";
B3 = \"GatherResults.class\";
%%
// secao de ligacoes
T1 = B1(1) << NULL;
T2 = B2(100) << T1;
T3 = B3(1) << T2;
";

fn cards(c: [u64; 6]) -> HashMap<String, u64> {
    (1..=6).map(|i| (format!("c{i}"), c[i - 1])).collect()
}

#[test]
fn item3_parses_fig_3_3_fig_4_5_and_appendix_a1() {
    let f33 = pasl::parse(FIG_3_3).unwrap();
    assert_eq!(f33.path.as_deref(), Some("aplicacoes/numerosPrimos"));
    assert_eq!(f33.links[0].input, Input::File("dados.dat".into()));
    assert_eq!(f33.links[2].output.as_deref(), Some("resultado.dat"));
    let d = f33.dag(&HashMap::new()).unwrap();
    assert_eq!(d.nodes.iter().map(|n| n.c).collect::<Vec<_>>(), [1, 100, 1]);
    assert_eq!(d.series_parallel().unwrap().to_string(), "𝔹1; 𝔹2; 𝔹3");

    let f45 = pasl::parse(FIG_4_5).unwrap();
    assert_eq!(
        f45.links[5].input,
        Input::Tasks(vec!["T2".into(), "T4".into(), "T5".into()])
    );
    assert_eq!(f45.links[1].card, Card::Name("c2".into()));

    let a1 = pasl::parse(A_1).unwrap();
    assert_eq!(a1.links[0].input, Input::Null);
    let d = a1.dag(&HashMap::new()).unwrap();
    assert_eq!(d.nodes[1].class, "ProcessData.class");
    assert_eq!(d.succ, vec![vec![1], vec![2], vec![]]);
}

#[test]
fn item3_fig_4_5_reduces_to_the_fig_4_12_model() {
    let dag = pasl::parse(FIG_4_5)
        .unwrap()
        .dag(&cards([1, 4, 4, 1, 1, 1]))
        .unwrap();
    let l = dag.series_parallel().unwrap();
    assert_eq!(format!("L = {l}"), "L = 𝔹1; (𝔹2 ‖ (𝔹3; (𝔹4 ‖ 𝔹5))); 𝔹6");
    assert_eq!(l.ascii(), "B1; (B2 || (B3; (B4 || B5))); B6");
}

#[test]
fn item3_validation_errors_name_the_place() {
    // c_1 must be 1.
    let e = pasl::parse(FIG_4_5)
        .unwrap()
        .dag(&cards([2, 4, 4, 1, 1, 1]))
        .unwrap_err();
    assert_eq!((e.line, e.column), (10, 1));
    assert!(e.msg.contains("first batch must have cardinality 1"), "{e}");
    // c_A must be 1.
    let e = pasl::parse(FIG_4_5)
        .unwrap()
        .dag(&cards([1, 4, 4, 1, 1, 3]))
        .unwrap_err();
    assert_eq!(e.line, 15);
    // An unbound cardinality.
    let e = pasl::parse(FIG_4_5)
        .unwrap()
        .dag(&HashMap::new())
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("line 10, column 1: cardinality `c1` has no value"),
        "{e}"
    );
    // A read of a later task (an edge to a lower index, a cycle) is refused.
    let back = FIG_3_3.replace("T2=B2(100) «T1;", "T2=B2(100) «T1,T3;");
    let e = pasl::parse(&back)
        .unwrap()
        .dag(&HashMap::new())
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("line 9, column 1: task `T2` reads `T3`"),
        "{e}"
    );
    // Undeclared batch, syntax errors.
    let e = pasl::parse(&FIG_3_3.replace("T3=B3(1)", "T3=B9(1)"))
        .unwrap()
        .dag(&HashMap::new())
        .unwrap_err();
    assert!(e.msg.contains("batch `B9` is not declared"), "{e}");
    let e = pasl::parse("B1=\"a\";\nT1=B1(1) < NULL;").unwrap_err();
    assert_eq!((e.line, e.column), (2, 10));
    let e = pasl::parse("B1=\"a\";\nT1=B1(1) << NULL").unwrap_err();
    assert!(e.msg.contains("expected `;`"), "{e}");
}

#[test]
fn non_series_parallel_graph_is_reported() {
    // 1→2, 1→3, 2→4, 3→4, 2→5, 4→5 … the N-shaped graph 2→4, 2→5, 3→4 is not SP.
    let src = "B1=\"a\";B2=\"b\";B3=\"c\";B4=\"d\";B5=\"e\";B6=\"f\";\n%%\n\
        T1=B1(1)<<NULL;\nT2=B2(2)<<T1;\nT3=B3(2)<<T1;\nT4=B4(2)<<T2,T3;\nT5=B5(2)<<T2;\nT6=B6(1)<<T4,T5;\n";
    let dag = pasl::parse(src).unwrap().dag(&HashMap::new()).unwrap();
    let e = dag.series_parallel().unwrap_err();
    assert!(e.msg.contains("not series-parallel"), "{e}");
}

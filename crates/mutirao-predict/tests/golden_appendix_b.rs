//! §7.3 item 7: the Appendix-B machine-model text round-trips bit for bit.
use mutirao_predict::machine::{AppendixB, MachineModel};

const EXCERPT: &str = include_str!("data/appendix_b.txt");

#[test]
fn item7_appendix_b_round_trip_bit_for_bit() {
    let doc: AppendixB = EXCERPT.parse().expect("the thesis excerpt parses");
    assert_eq!(doc.to_string(), EXCERPT);
    assert_eq!(doc.lines.len(), 37);
}

#[test]
fn appendix_b_model_round_trip_preserves_values() {
    let doc: AppendixB = EXCERPT.parse().unwrap();
    let mm = MachineModel::from_appendix_b(&doc);
    assert_eq!(mm.machines.len(), 2);
    assert_eq!(mm.machines[0].costs.len(), 17);
    // Export (sorted, shortest digits) and re-import: the same model, value for value.
    let again = MachineModel::from_appendix_b(&mm.to_appendix_b().to_string().parse().unwrap());
    assert_eq!(again, mm);
    // And through the native JSON form.
    assert_eq!(MachineModel::from_json(&mm.to_json()).unwrap(), mm);
}

#[test]
fn appendix_b_errors_name_line_and_column() {
    let e = "inter_sum_int[0]=[1.0;2.0]\ninter_sum_int[1]=[3.0;x]\n"
        .parse::<AppendixB>()
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 2, column 23: expected a number, found \"\""
    );
    let e = "inter_frob_int[0]=[1.0;2.0]\n"
        .parse::<AppendixB>()
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("line 1, column 7: unknown cost name \"frob_int\""),
        "{e}"
    );
    let e = "inter_sum_int[0]=[3.0;2.0]\n"
        .parse::<AppendixB>()
        .unwrap_err();
    assert!(e.to_string().contains("lo <= hi"), "{e}");
}
